// Command wallet makes many concurrent debits and credits on a few wallets,
// first with a naive read-compute-$set (which loses updates, creating or
// destroying money) and then with versioned.Modify (read-modify-write under
// a version check, conflicts retried), and prints operations, conflicts
// retried, and expected and actual totals. Then it runs four instances of
// the service at once, each with a client of its own, whose Modify gives up
// quickly on a busy wallet and queues the change instead (deferred): it
// prints how many changes applied now, were queued and applied later, or
// failed, and the final balances match the sum of the accepted changes.
// Where the server has transactions it also moves money between wallets in
// transactions; where it has not, it says so and skips them.
//
//	go run ./examples/wallet -wallets 2 -ops 1000
//
// This file is the wallet service a reader would write; the naive service,
// the workload, the checks and the table are in examples/internal.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/examples/internal/cli"
	"github.com/mongocas/mongocas/examples/internal/scenario"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// Wallet is a balance in cents. The repository owns Version: reads fill it
// in, writes raise it.
type Wallet struct {
	ID      string `bson:"_id"`
	Owner   string `bson:"owner"`
	Balance int64  `bson:"balance"`
	Version int64  `bson:"version"`
}

// errInsufficientFunds declines a debit the balance does not cover.
var errInsufficientFunds = errors.New("insufficient funds")

// wallets is the wallet service.
type wallets struct {
	repo   *versioned.Repo[Wallet]
	client *mongo.Client // for transactions
	// conflicts counts the version conflicts retried, for the metrics.
	conflicts atomic.Int64
}

// newWallets returns the service on the wallets collection. A service gets
// the collection from a client made once at start-up, with production
// defaults:
//
//	st, err := store.Connect(ctx, os.Getenv("MONGODB_URI"), nil)
//	...
//	w, err := newWallets(st.Database("bank").Collection("wallets"), observe.Slog(logger))
//
// obs sees each call, version conflict, retry and lost reply (nil: none).
func newWallets(coll *mongo.Collection, obs observe.Observer) (*wallets, error) {
	// Many writers share few wallets: allow more attempts than the default
	// (10 within 2s) before giving up with ErrConflict.
	return openWallets(coll, obs, retry.Policy{MaxAttempts: 50, MaxElapsedTime: 20 * time.Second})
}

// openWallets returns the service on coll, whose Modify retries conflicts
// under p, counting each retry.
func openWallets(coll *mongo.Collection, obs observe.Observer, p retry.Policy) (*wallets, error) {
	w := &wallets{client: coll.Database().Client()}
	p.OnRetry = func(retry.Attempt) { w.conflicts.Add(1) }
	repo, err := versioned.New[Wallet](coll, &versioned.Options{Observer: obs, Retry: p})
	if err != nil {
		return nil, err // bad options, or a Wallet that versioned cannot use
	}
	w.repo = repo
	return w, nil
}

// Create stores a new wallet. Insert gives it its first version.
func (w *wallets) Create(ctx context.Context, id, owner string, balance int64) error {
	err := w.repo.Insert(ctx, &Wallet{ID: id, Owner: owner, Balance: balance})
	if errors.Is(err, versioned.ErrDuplicate) {
		return fmt.Errorf("wallet %s exists already: %w", id, err)
	}
	return err
}

// Change credits (delta > 0) or debits (delta < 0) a wallet. Modify reads
// the wallet, calls fn on the copy and writes the fields fn changed only if
// the version is still the one read; after a conflict it reads again and
// calls fn again, with jittered backoff. So fn must only compute: no side
// effects.
func (w *wallets) Change(ctx context.Context, id string, delta int64) error {
	_, err := w.repo.Modify(ctx, id, func(wl *Wallet) error {
		if wl.Balance+delta < 0 {
			return errInsufficientFunds // no write; Modify returns it, wrapped
		}
		wl.Balance += delta
		return nil
	})
	var unknown *versioned.UnknownOutcomeError
	switch {
	case err == nil, errors.Is(err, errInsufficientFunds):
		return err
	case errors.Is(err, versioned.ErrConflict):
		// Still conflicting when the retry policy ran out: the wallet is
		// too busy. Nothing was written; the caller may try again (a 503).
		return fmt.Errorf("wallet %s busy, try again: %w", id, err)
	case errors.As(err, &unknown):
		// The reply was lost and re-reading could not tell whether the
		// change landed. Retrying could apply it twice: report it pending
		// and let reconciliation look for the write id in the wallet.
		return fmt.Errorf("change of wallet %s pending (write %s): %w", id, unknown.WriteID, err)
	case errors.Is(err, versioned.ErrNotFound):
		return fmt.Errorf("no wallet %s: %w", id, err) // a 404
	default:
		return fmt.Errorf("change of wallet %s: %w", id, err) // the driver's error, ctx ended...
	}
}

// Transfer moves amount from one wallet to another in one transaction: both
// change or neither. The versioned calls join the transaction through ctx
// (each raises its wallet's version, so that a concurrent Modify conflicts
// instead of overwriting). WithTransaction runs the function again after a
// transient error such as a write conflict with another transaction; each
// such retry is counted. It needs a replica set or a sharded cluster: keep
// it short and database-only.
func (w *wallets) Transfer(ctx context.Context, from, to string, amount int64) error {
	sess, err := w.client.StartSession()
	if err != nil {
		return err
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	attempts := 0
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		if attempts++; attempts > 1 {
			w.conflicts.Add(1)
		}
		_, err := w.repo.Guarded(ctx, from,
			bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: amount}}}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -amount}}}})
		if errors.Is(err, versioned.ErrGuardFailed) {
			return nil, errInsufficientFunds // aborts the transaction: nothing moved
		}
		if err != nil {
			return nil, err
		}
		_, err = w.repo.Guarded(ctx, to, nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: amount}}}})
		return nil, err
	})
	return err
}

// ConflictsRetried is how many version or write conflicts made a change or
// a transfer start again.
func (w *wallets) ConflictsRetried() int64 { return w.conflicts.Load() }

// queueingWallets is the wallet service with a fallback: a change that
// cannot be made now, because other instances of the service keep changing
// the wallet and the retries ran out, is queued and applied later, exactly
// once, by the queue's workers. The caller hears "accepted" (202, with the
// job to poll) instead of "busy, try again".
type queueingWallets struct {
	*wallets
	jobs   *deferred.Queue
	change *deferred.Change[Wallet, int64]
	stop   func() // stops the queue's workers
}

// newQueueingWallets returns the service on the wallets collection, with
// its queue in "<wallets>_jobs", and starts the queue's workers (every
// instance of the service runs some; Close stops them).
func newQueueingWallets(coll *mongo.Collection, obs observe.Observer) (*queueingWallets, error) {
	// Give up quickly on a busy wallet: the queue takes it from there.
	base, err := openWallets(coll, obs, retry.Policy{MaxAttempts: 3, MaxElapsedTime: 100 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	w := &queueingWallets{wallets: base}
	w.jobs, err = deferred.New(coll.Database().Collection(coll.Name()+"_jobs"), &deferred.Options{
		Workers:      4,
		PollInterval: 50 * time.Millisecond, // other instances' changes: look often
	})
	if err != nil {
		return nil, err
	}
	// The change, by name: the same function runs now (through Modify) or
	// later (through the queue, fenced so that it applies once).
	w.change, err = deferred.NewChange(w.jobs, "wallet.change", base.repo, func(wl *Wallet, delta int64) error {
		if wl.Balance+delta < 0 {
			// Now: returned to the caller. Queued: the job is dead at once
			// (retry.Permanent), not retried.
			return retry.Permanent(errInsufficientFunds)
		}
		wl.Balance += delta
		return nil
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.jobs.Run(ctx) // returns when ctx ends
	}()
	w.stop = func() { cancel(); <-done }
	return w, nil
}

// ChangeLater credits or debits a wallet now if it can, and queues the
// change if the wallet is too busy: it returns the queued job's id then
// (an HTTP service answers 202 Accepted, Location: /jobs/<id>).
func (w *queueingWallets) ChangeLater(ctx context.Context, id string, delta int64) (job string, err error) {
	res, err := w.change.ModifyOrEnqueue(ctx, id, delta)
	var unknown *versioned.UnknownOutcomeError
	switch {
	case err == nil && res.Queued:
		return res.JobID.Hex(), nil
	case err == nil, errors.Is(err, errInsufficientFunds):
		return "", err
	case errors.As(err, &unknown):
		// Never queued: the change may have landed.
		return "", fmt.Errorf("change of wallet %s pending (write %s): %w", id, unknown.WriteID, err)
	case errors.Is(err, versioned.ErrNotFound):
		return "", fmt.Errorf("no wallet %s: %w", id, err) // a 404
	default:
		return "", fmt.Errorf("change of wallet %s: %w", id, err) // bad input, the queue unreachable...
	}
}

// Outcome waits for a queued change to end (what GET /jobs/<id> polls
// for): nil when it was applied, errInsufficientFunds when the balance did
// not cover it when its turn came.
func (w *queueingWallets) Outcome(ctx context.Context, job string) error {
	id, err := bson.ObjectIDFromHex(job)
	if err != nil {
		return err
	}
	j, err := w.jobs.Wait(ctx, id, 20*time.Millisecond)
	switch {
	case err != nil:
		return err
	case j.State == deferred.StateCompleted:
		return nil
	case j.State == deferred.StateDead && strings.Contains(j.Errors[len(j.Errors)-1].Error, errInsufficientFunds.Error()):
		return fmt.Errorf("queued change of wallet %s: %w", j.Key, errInsufficientFunds)
	default:
		return fmt.Errorf("queued change %s ended %s", job, j.State)
	}
}

// Close stops the queue's workers.
func (w *queueingWallets) Close() { w.stop() }

// events counts what the service's repository reports; the program prints
// the counts under its table.
var events observe.Counters

// service is this file's service as the scenario runs it, beside the naive
// one: debits and credits, then the same with transfers where the server
// has transactions. The table names it after the call Change makes.
var service = scenario.WalletStrategy{
	Name:         "versioned.Modify",
	Kind:         scenario.KindMongocas,
	Open:         func(coll *mongo.Collection) (scenario.Wallets, error) { return newWallets(coll, &events) },
	Insufficient: errInsufficientFunds,
}

// fallback is the service with the queue, run as 4 instances (each with a
// client of its own) so that their changes to the same wallets conflict:
// one instance lines up its own calls on a wallet instead.
var fallback = scenario.WalletStrategy{
	Name:         "Modify, or queue when retries run out",
	Kind:         scenario.KindMongocas,
	Open:         func(coll *mongo.Collection) (scenario.Wallets, error) { return newQueueingWallets(coll, &events) },
	Insufficient: errInsufficientFunds,
	Instances:    4,
}

func main() {
	os.Exit(cli.Main("wallet", "Concurrent debits and credits: naive $set of the computed balance vs versioned.Modify, and Modify with a queue to fall back on.", os.Args[1:], os.Stdout, os.Stderr,
		&scenario.Wallet{Mongocas: service, Fallback: fallback}, &events))
}

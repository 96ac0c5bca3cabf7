// Package readme_test holds the Go code of the repository's README: every
// ```go block there is a piece of this file, verbatim (TestREADMEMatches
// checks it), and the examples and tests below run it against a real
// MongoDB-wire server.
package readme_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// README: guarded update

// Item is a product in stock; versioned keeps its version field.
type Item struct {
	SKU     string `bson:"_id"`
	Stock   int64  `bson:"stock"`
	Version int64  `bson:"version"`
}

var ErrSoldOut = errors.New("sold out")

// Take removes qty from stock if at least qty are left: one atomic
// statement, so there is no read first, no conflict and no retry.
func Take(ctx context.Context, items *versioned.Repo[Item], sku string, qty int64) error {
	_, err := items.Guarded(ctx, sku,
		bson.D{{Key: "stock", Value: bson.D{{Key: "$gte", Value: qty}}}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -qty}}}})
	if errors.Is(err, versioned.ErrGuardFailed) {
		return ErrSoldOut
	}
	return err // nil, or ErrNotFound, ErrInvalid, a driver error...
}

// README end

// README: read-modify-write

// Wallet is an account with a daily spending limit.
type Wallet struct {
	ID         string `bson:"_id"`
	Balance    int64  `bson:"balance"`
	Day        string `bson:"day"`
	SpentToday int64  `bson:"spent_today"`
	Version    int64  `bson:"version"`
}

var ErrDeclined = errors.New("declined")

// Spend takes amount from the wallet if the balance and today's limit allow
// it. fn runs on a freshly read copy and runs again after each version
// conflict (with jittered backoff), so it must not have side effects.
func Spend(ctx context.Context, wallets *versioned.Repo[Wallet], id, today string, amount, limit int64) (*Wallet, error) {
	return wallets.Modify(ctx, id, func(w *Wallet) error {
		if w.Day != today {
			w.Day, w.SpentToday = today, 0
		}
		if w.Balance < amount || w.SpentToday+amount > limit {
			return ErrDeclined // no write; Modify returns it (wrapped)
		}
		w.Balance -= amount
		w.SpentToday += amount
		return nil
	})
}

// README end

// README: lease around a partner call

// Partner is a slow external API.
type Partner interface {
	SetPrimary(ctx context.Context, idempotencyKey, userID, identity string) error
}

// ChangePrimary makes identity the user's primary one at the partner and
// then in our database. Only one request per user may do this at a time:
// the lease lives on the user's document (leases := lease.New(users, ...)),
// and no transaction, lock or connection is held during the partner call.
func ChangePrimary(ctx context.Context, leases *lease.Manager, users *mongo.Collection, partner Partner, userID, identity string) error {
	return leases.Do(ctx, userID, func(ctx context.Context, l *lease.Lease) error {
		// ctx ends if the lease is lost. The epoch is a fencing token and,
		// with the user id, an idempotency key the partner can dedupe on.
		key := fmt.Sprintf("%s/%d", userID, l.Epoch())
		if err := partner.SetPrimary(ctx, key, userID, identity); err != nil {
			return err
		}
		// Fenced: the write applies only while this lease is still held.
		res, err := users.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: userID}}, l.Fence()...),
			bson.D{{Key: "$set", Value: bson.D{{Key: "primary", Value: identity}}}})
		if err == nil && res.MatchedCount == 0 {
			return lease.ErrLost
		}
		return err
	})
}

// README end

// README: transfer in a transaction

// Transfer moves amount between two wallets: both change or neither. It
// needs a replica set or a sharded cluster; the versioned calls take part in
// the transaction through ctx. Keep it short and database-only.
func Transfer(ctx context.Context, client *mongo.Client, wallets *versioned.Repo[Wallet], from, to string, amount int64) error {
	sess, err := client.StartSession()
	if err != nil {
		return err
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		_, err := wallets.Guarded(ctx, from,
			bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: amount}}}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -amount}}}})
		if errors.Is(err, versioned.ErrGuardFailed) {
			return nil, ErrDeclined // aborts: nothing moved
		}
		if err != nil {
			return nil, err
		}
		_, err = wallets.Guarded(ctx, to, nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: amount}}}})
		return nil, err
	})
	return err
}

// README end

// README: a test with mongotest

func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

func TestTakeNeverOversells(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t) // a fresh database on a real server, dropped at the end
	items, err := versioned.New[Item](db.Collection("items"), nil)
	require.NoError(t, err)
	require.NoError(t, items.Insert(t.Context(), &Item{SKU: "mug", Stock: 5}))

	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() { errs <- Take(t.Context(), items, "mug", 1) })
	}
	wg.Wait()
	close(errs)
	sold := 0
	for err := range errs {
		if err == nil {
			sold++
		} else {
			require.ErrorIs(t, err, ErrSoldOut)
		}
	}
	require.Equal(t, 5, sold)
	mug, err := items.Get(t.Context(), "mug")
	require.NoError(t, err)
	require.Zero(t, mug.Stock)
}

// README end

// README: idempotency keys
// PSP is a payment provider that dedupes charges on an idempotency key.
type PSP interface {
	Charge(ctx context.Context, idempotencyKey, order string, amount int64) (chargeID string, err error)
}

// ChargeOnce charges an order once, however often the client retries with
// the same key: the first call runs, a retry gets its result back
// (Replayed), a retry while it runs gets an *idempotency.InProgressError
// (HTTP 409), and the key with another order or amount ErrMismatch (422).
func ChargeOnce(ctx context.Context, keys *idempotency.Keys, psp PSP, key, order string, amount int64) (idempotency.Result, error) {
	fingerprint := fmt.Appendf(nil, "%s %d", order, amount)
	return keys.Do(ctx, key, fingerprint, func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		// A step runs once across the retries of the request; partnerKey is
		// the same in each retry that resumes it, so the PSP dedupes too.
		charge, err := c.Step(ctx, "charge", func(ctx context.Context, partnerKey string) ([]byte, error) {
			id, err := psp.Charge(ctx, partnerKey, order, amount)
			return []byte(id), err
		})
		if errors.Is(err, ErrDeclined) {
			return idempotency.Result{Status: http.StatusPaymentRequired}, nil // final: stored, replayed
		}
		if err != nil {
			return idempotency.Result{}, err // transient: not stored, a retry runs again
		}
		return idempotency.Result{Status: http.StatusCreated, Body: charge}, nil
	})
}

// README end

// README: observability

// NewWallets returns the wallets repository of a service that logs what
// mongocas does (nothing at Info while all goes well; a lost lease or an
// unknown outcome is a warning) and counts it for its metrics page. The
// OpenTelemetry adapter, otelmongocas.New, joins the same way.
func NewWallets(coll *mongo.Collection, logger *slog.Logger, counts *observe.Counters) (*versioned.Repo[Wallet], error) {
	return versioned.New[Wallet](coll, &versioned.Options{
		Observer: observe.Join(observe.Slog(logger), counts),
	})
}

// README end

// README: deferred changes

// NewSpendLater registers, once at start-up in every instance, the change
// "wallet.spend": applied now when Modify can, and queued, then applied
// later, exactly once, when Modify's retries run out. Start the queue's
// workers with go jobs.Run(ctx).
func NewSpendLater(jobs *deferred.Queue, wallets *versioned.Repo[Wallet]) (*deferred.Change[Wallet, int64], error) {
	return deferred.NewChange(jobs, "wallet.spend", wallets, func(w *Wallet, amount int64) error {
		if w.Balance < amount {
			return retry.Permanent(ErrDeclined) // when queued: dead at once, not retried
		}
		w.Balance -= amount
		return nil
	})
}

// ServeSpend answers 200 with the wallet when the change applied now, and
// 202 with the job to poll when the wallet was too busy and it was queued.
func ServeSpend(w http.ResponseWriter, r *http.Request, spend *deferred.Change[Wallet, int64], id string, amount int64) {
	res, err := spend.ModifyOrEnqueue(r.Context(), id, amount)
	switch {
	case errors.Is(err, ErrDeclined):
		http.Error(w, "declined", http.StatusPaymentRequired)
	case errors.Is(err, versioned.ErrNotFound):
		http.Error(w, "no such wallet", http.StatusNotFound)
	case errors.Is(err, deferred.ErrInvalid):
		http.Error(w, err.Error(), http.StatusBadRequest)
	case err != nil:
		http.Error(w, "try again", http.StatusServiceUnavailable)
	case res.Queued:
		w.Header().Set("Location", "/jobs/"+res.JobID.Hex()) // GET: deferred.Queue.Job
		w.WriteHeader(http.StatusAccepted)
	default:
		w.Header().Set("Content-Type", "application/json")
		err := json.NewEncoder(w).Encode(struct {
			ID      string `json:"id"`
			Balance int64  `json:"balance"`
		}{res.Doc.ID, res.Doc.Balance})
		if err != nil {
			slog.WarnContext(r.Context(), "spend: write the answer", "err", err)
		}
	}
}

// README end

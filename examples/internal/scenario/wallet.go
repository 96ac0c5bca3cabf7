package scenario

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// Wallet (seed 004): many debits and credits at once on a few balances.
//
// The naive operation reads the balance, computes the new one in the
// application and $sets it: two operations that read the same balance both
// write their own result, and one of them is lost, so money is created or
// destroyed. The mongocas operation is versioned's read-modify-write: the
// write is conditional on the version read, and a conflict is retried on a
// fresh read with jittered backoff, so every acknowledged change lands
// exactly once. A transfer between two wallets changes two documents and
// needs a transaction; it runs only where the server has them.

// WalletStrategy names a way to change balances.
type WalletStrategy string

// The wallet strategies.
const (
	// WalletNaive reads the balance and $sets the computed one.
	WalletNaive WalletStrategy = "naive read, compute, $set"
	// WalletModify is versioned.Modify: read-modify-write under a version
	// check, conflicts retried.
	WalletModify WalletStrategy = "versioned.Modify"
	// WalletTransfer moves money between two wallets in one transaction
	// (two versioned.Guarded calls in it), with versioned.Modify deposits and
	// withdrawals running at the same time. It needs transactions.
	WalletTransfer WalletStrategy = "transfer in a transaction"
)

// WalletConfig sizes a wallet run. Zero fields take their defaults.
type WalletConfig struct {
	// Wallets is how many balances the operations share. Default 4.
	Wallets int
	// Operations is how many debits and credits are made. Default 300.
	Operations int
	// Transfers is how many transfers WalletTransfer makes besides the
	// operations. Default Operations/4.
	Transfers int
	// Concurrency is how many operations run at once. Default 8.
	Concurrency int
	// Opening is every wallet's opening balance, in cents. Default 5000.
	Opening int64
	// MaxAmount bounds each debit, credit or transfer, in cents. Default
	// 2500.
	MaxAmount int64
	// Seed makes the operations repeatable.
	Seed uint64
	// Progress, if not nil, receives a line now and then during a long run.
	Progress io.Writer
}

func (c WalletConfig) withDefaults() WalletConfig {
	if c.Wallets <= 0 {
		c.Wallets = 4
	}
	if c.Operations <= 0 {
		c.Operations = 300
	}
	if c.Transfers <= 0 {
		c.Transfers = max(c.Operations/4, 1)
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.Opening <= 0 {
		c.Opening = 5000
	}
	if c.MaxAmount <= 0 {
		c.MaxAmount = 2500
	}
	return c
}

// WalletResult is what a wallet run did.
type WalletResult struct {
	Row
	// Acknowledged is how many operations (and transfers) the caller was
	// told succeeded; Declined how many were refused for insufficient funds.
	Acknowledged, Declined int
	// ConflictsRetried is how many times a version conflict made
	// versioned.Modify (or a transaction) start again.
	ConflictsRetried int64
	// Expected is, per wallet, the opening balance plus the acknowledged
	// changes; Actual the stored balance.
	Expected, Actual []int64
	// ExpectedTotal and ActualTotal sum them.
	ExpectedTotal, ActualTotal int64
	// WrongWallets is how many wallets hold another balance than expected,
	// or a negative one.
	WrongWallets int
}

// Wallet is a balance document, in cents.
type Wallet struct {
	ID      string `bson:"_id"`
	Owner   string `bson:"owner"`
	Balance int64  `bson:"balance"`
	Version int64  `bson:"version"`
}

// errInsufficient declines a debit that would take a balance below zero.
var errInsufficient = errors.New("insufficient funds")

// walletOp is a debit (negative) or credit (positive) on one wallet, or a
// transfer of amount from one wallet to another.
type walletOp struct {
	wallet, to int
	delta      int64
	transfer   bool
}

// ErrNoTransactions is returned by RunWallet for WalletTransfer, and by
// RunIdentity for IdentityTxAcrossHTTP, when the server has no
// multi-document transactions. A transfer is never faked with two
// independent writes.
var ErrNoTransactions = errors.New("this server has no multi-document transactions")

// RunWallet runs one wallet strategy on a fresh collection of db.
// transactions says whether the server has them (store.Capabilities).
func RunWallet(ctx context.Context, db *mongo.Database, s WalletStrategy, transactions bool, cfg WalletConfig) (*WalletResult, error) {
	cfg = cfg.withDefaults()
	if s == WalletTransfer && !transactions {
		return nil, ErrNoTransactions
	}
	coll := db.Collection("wallets_" + slug(string(s)))
	if err := coll.Drop(ctx); err != nil {
		return nil, fmt.Errorf("wallet: drop: %w", err)
	}
	var conflicts atomic.Int64
	repo, err := versioned.New[Wallet](coll, &versioned.Options{Retry: retry.Policy{
		// Many writers share few documents: allow more attempts than the
		// default, and count each retry.
		MaxAttempts:    50,
		MaxElapsedTime: 20 * time.Second,
		OnRetry:        func(retry.Attempt) { conflicts.Add(1) },
	}})
	if err != nil {
		return nil, err
	}
	ids := make([]string, cfg.Wallets)
	for i := range ids {
		ids[i] = fmt.Sprintf("wallet-%02d", i+1)
		if err := repo.Insert(ctx, &Wallet{ID: ids[i], Owner: fmt.Sprintf("user %d", i+1), Balance: cfg.Opening}); err != nil {
			return nil, fmt.Errorf("wallet: insert: %w", err)
		}
	}

	rng := rand.New(rand.NewPCG(cfg.Seed, 0x3a11e7))
	var ops []walletOp
	for range cfg.Operations {
		amount := 1 + rng.Int64N(cfg.MaxAmount)
		if rng.IntN(2) == 0 {
			amount = -amount
		}
		ops = append(ops, walletOp{wallet: rng.IntN(cfg.Wallets), delta: amount})
	}
	if s == WalletTransfer && cfg.Wallets > 1 {
		for range cfg.Transfers {
			from := rng.IntN(cfg.Wallets)
			to := (from + 1 + rng.IntN(cfg.Wallets-1)) % cfg.Wallets
			ops = append(ops, walletOp{wallet: from, to: to, delta: 1 + rng.Int64N(cfg.MaxAmount), transfer: true})
		}
		rng.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	}

	var apply func(ctx context.Context, op walletOp) error
	switch s {
	case WalletNaive:
		apply = func(ctx context.Context, op walletOp) error { return changeNaive(ctx, coll, ids[op.wallet], op.delta) }
	case WalletModify, WalletTransfer:
		apply = func(ctx context.Context, op walletOp) error {
			if op.transfer {
				return transfer(ctx, db.Client(), repo, ids[op.wallet], ids[op.to], op.delta, &conflicts)
			}
			_, err := repo.Modify(ctx, ids[op.wallet], func(w *Wallet) error {
				if w.Balance+op.delta < 0 {
					return errInsufficient
				}
				w.Balance += op.delta
				return nil
			})
			return err
		}
	default:
		return nil, fmt.Errorf("wallet: unknown strategy %q", s)
	}

	warmUp(ctx, db, cfg.Concurrency)
	res := &WalletResult{Row: Row{Scenario: "wallet", Strategy: string(s), Kind: kindOf(s != WalletNaive), Requests: len(ops)}}
	outcomes := make([]error, len(ops))
	var rec recorder
	start := time.Now()
	p := startProgress(cfg.Progress, "wallet/"+string(s), len(ops))
	forEach(len(ops), cfg.Concurrency, p, func(i int) {
		rec.time(func() { outcomes[i] = apply(ctx, ops[i]) })
	})
	p.end()
	res.Elapsed, res.Latency = time.Since(start), rec.latency()
	res.ConflictsRetried = conflicts.Load()

	res.Expected = make([]int64, cfg.Wallets)
	for i := range res.Expected {
		res.Expected[i] = cfg.Opening
	}
	var firstErr error
	for i, err := range outcomes {
		op := ops[i]
		switch {
		case err == nil:
			res.Acknowledged++
			if op.transfer {
				res.Expected[op.wallet] -= op.delta
				res.Expected[op.to] += op.delta
			} else {
				res.Expected[op.wallet] += op.delta
			}
		case errors.Is(err, errInsufficient):
			res.Declined++
		default:
			res.Errors++
			firstErr = cmp.Or(firstErr, err)
		}
	}
	res.Actual = make([]int64, cfg.Wallets)
	for i, id := range ids {
		var w Wallet
		if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&w); err != nil {
			return nil, fmt.Errorf("wallet: read final balance: %w", err)
		}
		res.Actual[i] = w.Balance
		res.ExpectedTotal += res.Expected[i]
		res.ActualTotal += w.Balance
		if w.Balance != res.Expected[i] || w.Balance < 0 {
			res.WrongWallets++
		}
	}
	res.Anomalies = res.WrongWallets
	transfers, conflictsLine := "", fmt.Sprintf("%d conflicts retried", res.ConflictsRetried)
	if s == WalletTransfer {
		transfers = fmt.Sprintf(" (%d of them transfers)", cfg.Transfers)
	}
	if s == WalletNaive {
		conflictsLine = "conflicts go unseen"
	}
	res.Details = append(res.Details,
		fmt.Sprintf("%d operations%s on %d wallets: %d acknowledged, %d declined for insufficient funds, %s",
			len(ops), transfers, cfg.Wallets, res.Acknowledged, res.Declined, conflictsLine),
		fmt.Sprintf("expected total %s, actual %s%s; %d of %d wallets wrong",
			money(res.ExpectedTotal), money(res.ActualTotal), createdOrDestroyed(res.ActualTotal-res.ExpectedTotal), res.WrongWallets, cfg.Wallets))
	if firstErr != nil {
		res.Details = append(res.Details, fmt.Sprintf("%d requests failed, first: %v", res.Errors, firstErr))
	}
	return res, nil
}

// changeNaive is seed 004's lost update: read, compute, $set.
func changeNaive(ctx context.Context, coll *mongo.Collection, id string, delta int64) error {
	var w Wallet
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&w); err != nil {
		return err
	}
	if w.Balance+delta < 0 {
		return errInsufficient
	}
	_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "balance", Value: w.Balance + delta}}}})
	return err
}

// transfer moves amount from one wallet to another in one transaction: a
// guarded debit ("only if the balance covers it") and a credit, both through
// the versioned repository so that their version bumps keep concurrent
// Modify calls honest. WithTransaction retries the whole transaction on a
// transient error (a write conflict with a concurrent writer), and each such
// retry is counted.
func transfer(ctx context.Context, client *mongo.Client, repo *versioned.Repo[Wallet], from, to string, amount int64, conflicts *atomic.Int64) error {
	sess, err := client.StartSession()
	if err != nil {
		return err
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	attempts := 0
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		if attempts++; attempts > 1 {
			conflicts.Add(1)
		}
		_, err := repo.Guarded(ctx, from,
			bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: amount}}}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -amount}}}})
		if errors.Is(err, versioned.ErrGuardFailed) {
			return nil, errInsufficient // aborts the transaction: nothing was moved
		}
		if err != nil {
			return nil, err
		}
		_, err = repo.Guarded(ctx, to, nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: amount}}}})
		return nil, err
	})
	return err
}

// money formats cents.
func money(c int64) string {
	sign := ""
	if c < 0 {
		sign, c = "-", -c
	}
	return fmt.Sprintf("%s%d.%02d", sign, c/100, c%100)
}

func createdOrDestroyed(d int64) string {
	switch {
	case d > 0:
		return fmt.Sprintf(" (%s created from nothing)", money(d))
	case d < 0:
		return fmt.Sprintf(" (%s destroyed)", money(-d))
	}
	return ""
}

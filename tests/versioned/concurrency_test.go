package versioned_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// patient retries conflicts until the test's context ends, so that every
// goroutine gets all its increments through. Its backoff starts longer than
// the default because the embedded backend serves only about 500 writes a
// second: with 16 writers on one document, a 5ms first delay mostly buys
// another conflict.
var patient = retry.Policy{MaxAttempts: -1, MaxElapsedTime: -1, InitialInterval: 50 * time.Millisecond, MaxInterval: 400 * time.Millisecond}

// TestConcurrentModifyLosesNoUpdate: 16 goroutines × 200 read-modify-write
// increments of one document end at exactly 3,200.
func TestConcurrentModifyLosesNoUpdate(t *testing.T) {
	t.Parallel()
	const workers, each = 16, 200
	var retries atomic.Int64
	p := patient
	p.OnRetry = func(retry.Attempt) { retries.Add(1) }
	repo, b := setup[account](t, &versioned.Options{Retry: p})
	hot := &account{ID: "hot"}
	require.NoError(t, repo.Insert(b.ctx, hot))

	var acked, calls atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for range each {
				_, err := repo.Modify(b.ctx, "hot", func(a *account) error {
					calls.Add(1)
					a.Balance++
					return nil
				})
				if err != nil {
					t.Errorf("modify: %v", err)
					return
				}
				acked.Add(1)
			}
		})
	}
	wg.Wait()
	got, err := repo.Get(b.ctx, "hot")
	require.NoError(t, err)
	t.Logf("%d increments in %v: %d calls of fn, %d retries", acked.Load(), time.Since(start), calls.Load(), retries.Load())
	require.Equal(t, int64(workers*each), acked.Load())
	require.Equal(t, int64(workers*each), got.Balance, "no acknowledged increment was lost, none applied twice")
	require.Equal(t, hot.Version+workers*each, got.Version, "one version per write")
}

var errInsufficient = errors.New("insufficient funds")

// TestConcurrentWallets: 8 goroutines × 500 random deposits and withdrawals
// on 10 wallets, through Modify and Guarded alike, a withdrawal refused when
// it would take the balance below zero. Every write returns the state it
// produced, and every write raises the version by exactly one, so the
// states returned are the wallet's whole history: the test checks that it
// has no gap and no repeat, that each step is the delta of the write that
// made it, that no state is below zero, and that each wallet ends at its
// opening balance plus the sum of its acknowledged deltas.
func TestConcurrentWallets(t *testing.T) {
	t.Parallel()
	const workers, each, wallets = 8, 500, 10
	repo, b := setup[account](t, &versioned.Options{Retry: patient})

	type step struct {
		delta   int64
		balance int64
	}
	var (
		mu      sync.Mutex
		opening = map[string]int64{}
		start   = map[string]int64{}          // the version Insert gave
		acked   = map[string]int64{}          // sum of acknowledged deltas
		history = map[string]map[int64]step{} // version -> the write that made it
		refused atomic.Int64
		seenNeg atomic.Int64
	)
	ids := make([]string, wallets)
	for i := range ids {
		ids[i] = "w" + string(rune('0'+i))
		opening[ids[i]] = int64(20 + 10*i)
		history[ids[i]] = map[int64]step{}
		w := &account{ID: ids[i], Balance: opening[ids[i]]}
		require.NoError(t, repo.Insert(b.ctx, w))
		start[ids[i]] = w.Version
	}
	record := func(id string, delta int64, a *account) {
		mu.Lock()
		defer mu.Unlock()
		if _, dup := history[id][a.Version]; dup {
			t.Errorf("%s: version %d produced twice", id, a.Version)
		}
		history[id][a.Version] = step{delta: delta, balance: a.Balance}
		acked[id] += delta
	}

	var wg sync.WaitGroup
	for w := range uint64(workers) {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(w, 42))
			for range each {
				id := ids[rng.IntN(wallets)]
				amount := int64(1 + rng.IntN(30))
				deposit, guarded := rng.IntN(2) == 0, rng.IntN(2) == 0
				var (
					got *account
					err error
				)
				switch {
				case deposit && guarded:
					got, err = repo.Guarded(b.ctx, id, nil, bson.M{"$inc": bson.M{"balance": amount}})
				case deposit:
					got, err = repo.Modify(b.ctx, id, func(a *account) error {
						if a.Balance < 0 {
							seenNeg.Add(1)
						}
						a.Balance += amount
						return nil
					})
				case guarded:
					got, err = repo.Guarded(b.ctx, id,
						bson.M{"balance": bson.M{"$gte": amount}},
						bson.M{"$inc": bson.M{"balance": -amount}})
				default:
					got, err = repo.Modify(b.ctx, id, func(a *account) error {
						if a.Balance < 0 {
							seenNeg.Add(1)
						}
						if a.Balance < amount {
							return errInsufficient
						}
						a.Balance -= amount
						return nil
					})
				}
				switch {
				case err == nil:
					delta := amount
					if !deposit {
						delta = -amount
					}
					record(id, delta, got)
				case !deposit && (errors.Is(err, versioned.ErrGuardFailed) || errors.Is(err, errInsufficient)):
					refused.Add(1)
				default:
					t.Errorf("%s: %v", id, err)
					return
				}
			}
		})
	}
	wg.Wait()

	require.Zero(t, seenNeg.Load(), "no read saw a negative balance")
	cur, err := b.coll.Find(b.ctx, bson.M{})
	require.NoError(t, err)
	var final []account
	require.NoError(t, cur.All(b.ctx, &final))
	require.Len(t, final, wallets)
	total := 0
	for _, f := range final {
		require.GreaterOrEqual(t, f.Balance, int64(0), f.ID)
		require.Equal(t, opening[f.ID]+acked[f.ID], f.Balance, "%s ends at opening + acknowledged deltas", f.ID)
		h := history[f.ID]
		require.Len(t, h, int(f.Version-start[f.ID]), "%s: every version from %d to %d was returned by exactly one write", f.ID, start[f.ID]+1, f.Version)
		prev := opening[f.ID]
		for v := start[f.ID] + 1; v <= f.Version; v++ {
			s, ok := h[v]
			require.True(t, ok, "%s: version %d missing", f.ID, v)
			require.Equal(t, prev+s.delta, s.balance, "%s: version %d is version %d plus its write's delta", f.ID, v, v-1)
			require.GreaterOrEqual(t, s.balance, int64(0), "%s: version %d", f.ID, v)
			prev = s.balance
		}
		total += len(h)
	}
	t.Logf("%d writes acknowledged, %d withdrawals refused", total, refused.Load())
	require.Equal(t, workers*each, total+int(refused.Load()))
}

// TestBuyersRace: 50 buyers race for the last 10 items with a guarded
// update; exactly 10 succeed and the stock ends at 0, each sale returning a
// distinct remaining stock from 9 down to 0.
func TestBuyersRace(t *testing.T) {
	t.Parallel()
	const buyers, stock = 50, 10
	repo, b := setup[item](t, nil)
	last := &item{SKU: "last-ones", Stock: stock}
	require.NoError(t, repo.Insert(b.ctx, last))

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		left    = map[int64]bool{}
		refused atomic.Int64
		ready   = make(chan struct{})
	)
	for range buyers {
		wg.Go(func() {
			<-ready
			got, err := repo.Guarded(b.ctx, "last-ones",
				bson.M{"stock": bson.M{"$gte": 1}},
				bson.M{"$inc": bson.M{"stock": -1}})
			switch {
			case err == nil:
				mu.Lock()
				left[got.Stock] = true
				mu.Unlock()
			case errors.Is(err, versioned.ErrGuardFailed):
				refused.Add(1)
			default:
				t.Errorf("buy: %v", err)
			}
		})
	}
	close(ready)
	wg.Wait()

	require.Len(t, left, stock, "exactly 10 buyers succeeded, each leaving a different stock")
	for s := range int64(stock) {
		require.True(t, left[s], "a sale left %d", s)
	}
	require.Equal(t, int64(buyers-stock), refused.Load())
	m := b.raw(t, "last-ones")
	require.Equal(t, int64(0), m["stock"])
	require.Equal(t, last.Version+stock, m["version"])
}

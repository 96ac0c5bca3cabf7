package move_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/retry"
)

// BenchmarkMoves moves b.N random amounts among 100 accounts from 16
// goroutines, relayed by two queues of 10 workers each, and reports the
// moves settled per second (from the first debit to the last clean-up)
// and the round trips of the caller's debit (its client carries nothing
// else: the enqueue goes through the queue's own client).
//
//	go test -run '^$' -bench Moves -benchtime 2000x ./tests/move
func BenchmarkMoves(b *testing.B) {
	const accounts = 100
	bb := setup(b)
	names := make([]string, accounts)
	for i := range names {
		names[i] = fmt.Sprintf("acct-%03d", i)
		bb.insert(b, names[i], 1_000_000)
	}
	newQueue := func() *deferred.Queue {
		q, err := deferred.New(bb.db.Collection("jobs"), &deferred.Options{
			Workers: 10, PollInterval: 50 * time.Millisecond, HoleTimeout: 500 * time.Millisecond,
			Backoff: retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		})
		require.NoError(b, err)
		return q
	}
	for range 2 {
		q := newQueue()
		bb.mover(b, q, nil, nil)
		run(b, q)
	}
	f := bb.db.Faulty(b, nil)
	caller := bb.mover(b, newQueue(), f.Database, nil) // its queue only enqueues

	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	before := f.Requests()
	var wg sync.WaitGroup
	for g := range uint64(16) {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(g, 1))
			for next.Add(1) <= int64(b.N) {
				from, to := names[rng.IntN(accounts)], names[rng.IntN(accounts)]
				if from == to {
					to = names[(rng.IntN(accounts-1)+1+indexOf(names, from))%accounts]
				}
				if _, err := caller.Move(context.Background(), from, to, int64(1+rng.IntN(100)), nil); err != nil {
					b.Errorf("Move: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	debits := f.Requests() - before
	debitTime := time.Since(start)
	for {
		n, err := bb.db.Collection("accounts").CountDocuments(bb.ctx, bson.D{{Key: "_mv.n", Value: bson.D{{Key: "$gt", Value: 0}}}})
		require.NoError(b, err)
		if n == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "moves/s")
	b.ReportMetric(float64(b.N)/debitTime.Seconds(), "debits/s")
	b.ReportMetric(float64(debits)/float64(b.N), "debit-round-trips")
	s, err := bb.observer(b).Sum(bb.ctx, anys(names)...)
	require.NoError(b, err)
	require.Equal(b, int64(accounts*1_000_000), s.Sum)
	_ = move.Done
}

func indexOf(names []string, s string) int {
	for i, n := range names {
		if n == s {
			return i
		}
	}
	return -1
}

func anys(names []string) []any {
	out := make([]any, len(names))
	for i, n := range names {
		out[i] = n
	}
	return out
}

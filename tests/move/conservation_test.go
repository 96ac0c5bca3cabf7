package move_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/tests/internal/stress"
	"github.com/mongocas/mongocas/versioned"
)

// moved is one Move call of the conservation test and what it answered.
type moved struct {
	id       bson.ObjectID
	from, to string
	v        int64
	unknown  bool // the debit's outcome was unknown
}

// TestConcurrentMovesConserveTheTotal moves random amounts among 20
// accounts from three processes (each its own client behind a fault proxy,
// its own queue worker), with replies dropped and copies held and
// delivered late, for 4 s (60 s with MONGOCAS_STRESS=1), and one process
// cut off mid-run (its connections stop answering and its queue stops, as
// for a killed process). Sampled every 100 ms during the run, the sum of
// balances plus pending entries is the starting total; at the end, after
// the relay and Sweep ran, no move is pending, the balances are exactly
// the start plus the moves reported done (so each applied once and each
// returned one did not), and none is below zero.
func TestConcurrentMovesConserveTheTotal(t *testing.T) {
	const (
		accounts  = 20
		start     = 1000
		processes = 3
		movers    = 3 // goroutines per process
	)
	duration := stress.Pick(4*time.Second, time.Minute) // MONGOCAS_STRESS=1: 60 s
	b := setup(t)
	ids := make([]any, 0, accounts+1)
	names := make([]string, 0, accounts)
	for i := range accounts {
		name := fmt.Sprintf("acct-%02d", i)
		b.insert(t, name, start)
		ids = append(ids, name)
		names = append(names, name)
	}
	require.NoError(t, b.accounts.Insert(b.ctx, &account{ID: "shut", Closed: true}))
	ids = append(ids, "shut")
	const total = accounts * start
	opts := func() *move.Options {
		return &move.Options{Field: "balance", Grace: 200 * time.Millisecond,
			Outcomes: b.db.Collection("accounts_moves"),
			Accept:   bson.D{{Key: "closed", Value: bson.D{{Key: "$ne", Value: true}}}},
			Repo:     &versioned.Options{ResolveTimeout: 2 * time.Second}}
	}
	jobs := b.queue(t, nil) // never run: its Counts say what the relays have left to do
	obs := b.mover(t, jobs, nil, opts())

	procs := b.processes(t, processes, opts)

	var (
		mu     sync.Mutex
		moves  []moved
		failed atomic.Int64
	)
	ctx, cancel := context.WithTimeout(b.ctx, duration)
	defer cancel()
	var wg sync.WaitGroup
	for pi, p := range procs {
		for g := range movers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(pi)<<32|uint64(g), 0)) //nolint:gosec // small non-negative loop indexes
				for ctx.Err() == nil && p.alive.Load() {
					from := names[rng.IntN(len(names))]
					to := names[rng.IntN(len(names))]
					switch rng.IntN(10) {
					case 0:
						to = "ghost" // missing: returned
					case 1:
						to = "shut" // refuses: returned
					}
					if to == from {
						continue
					}
					v := int64(1 + rng.IntN(300))
					id, err := p.m.Move(context.Background(), from, to, v, nil)
					switch {
					case err == nil:
						mu.Lock()
						moves = append(moves, moved{id: id, from: from, to: to, v: v})
						mu.Unlock()
					case errors.Is(err, move.ErrInvalid):
						t.Errorf("Move: %v", err)
					case errors.Is(err, versioned.ErrUnknownOutcome):
						mu.Lock()
						moves = append(moves, moved{id: id, from: from, to: to, v: v, unknown: true})
						mu.Unlock()
					default:
						// The guard failed, or a definite error: nothing moved.
						if failed.Add(1) <= 3 {
							t.Logf("Move: %v", err)
						}
					}
				}
			})
		}
	}

	held := faults(ctx, &wg, procs, 40*time.Millisecond, []string{"debit", "credit", "refusal", "finish", "record", "clean"})

	samples, unstable := sample(ctx, t, &wg, obs, ids, total)

	// Process 1 is cut off halfway: its connections fail, its queue stops.
	time.Sleep(duration / 2)
	procs[1].cutOff()
	wg.Wait()
	held.deliverAll() // what is still held; then the relay and Sweep settle all
	b.settleAll(t, obs, jobs)
	b.requireNoMoveState(t)

	want := map[string]int64{"shut": 0}
	for _, n := range names {
		want[n] = start
	}
	var done, returned, lost int
	for _, mv := range moves {
		st, err := obs.Status(b.ctx, mv.from, mv.id)
		if mv.unknown && errors.Is(err, move.ErrNotFound) {
			lost++ // the debit never landed
			continue
		}
		require.NoError(t, err, "move %s", mv.id.Hex())
		switch st {
		case move.Done:
			done++
			want[mv.from] -= mv.v
			want[mv.to] += mv.v
		case move.Returned:
			returned++
		default:
			t.Fatalf("move %s is %s after the relay ran", mv.id.Hex(), st)
		}
	}
	var sum int64
	for id, bal := range want {
		got := b.balance(t, id)
		require.Equal(t, bal, got, "balance of %s", id)
		require.GreaterOrEqual(t, got, int64(0), id)
		sum += got
	}
	require.Equal(t, int64(total), sum)
	s, err := obs.Sum(b.ctx, ids...)
	require.NoError(t, err)
	require.Equal(t, int64(total), s.Sum)
	require.Positive(t, samples.Load(), "no sample agreed")
	require.Positive(t, done)
	require.Positive(t, returned)
	t.Logf("%d moves: %d done, %d returned, %d debits that did not land; %d refused; %d samples, %d unstable; %d held copies",
		len(moves), done, returned, lost, failed.Load(), samples.Load(), unstable.Load(), held.count())
}

package versioned_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/tests/internal/shardtest"
	"github.com/mongocas/mongocas/versioned"
)

// TestShardKeyCombinedModify: Modify calls on one document of a sharded
// collection wait in line and are combined, and every command of the
// combined path (the batch's read, its CAS write in either form, the
// re-read or the returned document after a conflict with another process)
// carries the shard key. One call's fn writes through another process's
// repository, so the write it is part of conflicts; one call's fn changes
// the shard key, and only that call is refused (an *InvalidError), nothing
// of it written. The counter is exact, the shard key unchanged, and each
// call's events (its own Start context) are start, then one conflict and
// one retry per failed attempt of its own, then its end, with attempts =
// conflicts + 1.
func TestShardKeyCombinedModify(t *testing.T) {
	const workers = 8
	b := setupShard(t)
	ctx := context.Background()
	rec := &perCall{}
	repo, err := versioned.New[regional](b.f.Collection("docs"), &versioned.Options{
		ShardKey: b.key.Fields, Observer: rec,
		Retry: retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond},
	})
	require.NoError(t, err)
	eu := b.doc(t, "acct-1", shardtest.Regions[0], 1)
	require.NoError(t, repo.Insert(ctx, eu))
	start := eu.Version
	b.capture.Take()

	var (
		wg                sync.WaitGroup
		gate              = make(chan struct{})
		wrote             atomic.Bool // the other process's write has been made
		acked, other      atomic.Int64
		refused, fnCalls  atomic.Int64
		errsMu            sync.Mutex
		errs              []error
		leaderMayGoOnOnce sync.Once
	)
	fail := func(err error) {
		errsMu.Lock()
		errs = append(errs, err)
		errsMu.Unlock()
	}
	rec.onStart = func(n int) {
		if n == workers {
			leaderMayGoOnOnce.Do(func() { close(gate) })
		}
	}
	for w := range workers {
		wg.Go(func() {
			cctx := context.WithValue(ctx, callKey{}, w)
			_, err := repo.Modify(cctx, b.keyOf(eu), func(d *regional) error {
				fnCalls.Add(1)
				if w == 0 {
					<-gate // the others are in line behind it
				}
				if w == 1 && wrote.CompareAndSwap(false, true) {
					// Another process writes between the batch's read
					// and its write: the write fails, the batch retries.
					_, err := b.other.Guarded(ctx, b.keyOf(eu), nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
					if err != nil {
						return err
					}
					other.Add(1)
				}
				if w == 2 {
					d.Region = shardtest.Regions[1] // refused: the shard key may not change
				}
				d.Balance++
				return nil
			})
			switch {
			case w == 2 && errors.Is(err, versioned.ErrInvalid):
				refused.Add(1)
			case err != nil:
				fail(err)
			default:
				acked.Add(1)
			}
		})
	}
	wg.Wait()
	require.Empty(t, errs)
	require.Equal(t, int64(1), refused.Load(), "the call that changed the shard key is refused")
	require.Equal(t, int64(workers-1), acked.Load())

	got, err := repo.Get(ctx, b.keyOf(eu))
	require.NoError(t, err)
	require.Equal(t, eu.Region, got.Region, "the shard key is unchanged")
	require.Equal(t, eu.AccountID, got.AccountID)
	require.Equal(t, eu.Balance+acked.Load()+other.Load(), got.Balance, "exact: every acknowledged increment once, the refused one not")
	require.Equal(t, start+acked.Load()+other.Load(), got.Version, "one version per change")

	cmds := b.capture.Take()
	n := shardtest.RequireTargeted(t, cmds, b.routes)
	writes := 0
	for _, c := range cmds {
		if c.Name == "update" || c.Name == "findAndModify" {
			writes++
		}
	}
	t.Logf("%d calls, %d fn calls, %d commands (%d filters checked), %d writes: %v", workers, fnCalls.Load(), len(cmds), n, writes, shardtest.Names(cmds))

	conflicts := 0
	for w := range workers {
		evs := rec.of(w)
		require.GreaterOrEqual(t, len(evs), 2, "call %d: %v", w, evs)
		require.Equal(t, observe.OpStart, evs[0].Kind, "call %d", w)
		end := evs[len(evs)-1]
		require.Equal(t, observe.OpEnd, end.Kind, "call %d", w)
		mid := evs[1 : len(evs)-1]
		require.Len(t, mid, 2*(end.Attempt-1), "call %d: a conflict and a retry per failed attempt: %v", w, evs)
		for i := 0; i < len(mid); i += 2 {
			require.Equal(t, observe.Conflict, mid[i].Kind, "call %d: %v", w, evs)
			require.Equal(t, observe.Retry, mid[i+1].Kind, "call %d: %v", w, evs)
			require.Equal(t, i/2+1, mid[i+1].Attempt, "call %d: the retry names the call's own attempt", w)
		}
		conflicts += len(mid) / 2
		if w == 2 {
			require.Equal(t, observe.OutcomeInvalid, end.Outcome)
		} else {
			require.Equal(t, observe.OK, end.Outcome, "call %d", w)
		}
	}
	require.Positive(t, conflicts, "the other process's write made a write of the line conflict")
}

// callKey marks a test call's context with its number.
type callKey struct{}

// perCall is an Observer that keeps each call's events apart, by the
// number in its context (callKey).
type perCall struct {
	mu      sync.Mutex
	starts  int
	events  map[int][]observe.Event
	onStart func(starts int)
}

func (p *perCall) Start(ctx context.Context, e observe.Event) context.Context {
	p.Observe(ctx, e)
	p.mu.Lock()
	p.starts++
	n, f := p.starts, p.onStart
	p.mu.Unlock()
	if f != nil {
		f(n)
	}
	return ctx
}

func (p *perCall) Observe(ctx context.Context, e observe.Event) {
	w, ok := ctx.Value(callKey{}).(int)
	if !ok {
		w = -1
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.events == nil {
		p.events = map[int][]observe.Event{}
	}
	p.events[w] = append(p.events[w], e)
}

func (p *perCall) of(w int) []observe.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]observe.Event(nil), p.events[w]...)
}

package move_test

// What the concurrent tests share: processes (each a client behind its own
// fault proxy, with its own queue worker), the faults they suffer, the
// sampler of the invariant's sum, and the final settling.

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

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// process is one of a test's processes: a client behind its own fault
// proxy, its queue (running) and a Mover through both.
type process struct {
	f     *mongotest.Faulty
	q     *deferred.Queue
	m     *move.Mover
	stop  func()
	alive atomic.Bool
}

// processes starts n processes whose Movers take opts() (their queue's
// owner is "process-i").
func (b *bundle) processes(t *testing.T, n int, opts func() *move.Options) []*process {
	t.Helper()
	procs := make([]*process, n)
	for i := range procs {
		p := &process{f: b.db.Faulty(t, nil)}
		q, err := deferred.New(b.db.Collection("jobs"), &deferred.Options{
			Owner:             fmt.Sprintf("process-%d", i),
			PollInterval:      50 * time.Millisecond,
			HoleTimeout:       500 * time.Millisecond,
			VisibilityTimeout: 3 * time.Second,
			Backoff:           retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
			MaxAttempts:       1000,
		})
		require.NoError(t, err)
		p.q = q
		o := opts()
		o.Outcomes = p.f.Collection(o.Outcomes.Name())
		p.m = b.mover(t, q, p.f.Database, o)
		p.stop = run(t, q)
		p.alive.Store(true)
		procs[i] = p
	}
	return procs
}

// cutOff makes p as good as killed: its connections stop answering and
// its queue stops.
func (p *process) cutOff() {
	p.alive.Store(false)
	p.f.Pause(time.Hour)
	p.stop()
}

// heldCopies are the writes the faults held.
type heldCopies struct {
	mu   sync.Mutex
	list []*mongotest.Fault
}

func (h *heldCopies) add(f *mongotest.Fault) {
	h.mu.Lock()
	h.list = append(h.list, f)
	h.mu.Unlock()
}

func (h *heldCopies) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.list)
}

// deliverAll delivers every copy still held.
func (h *heldCopies) deliverAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range h.list {
		if f.HasFired() {
			_, _ = f.Deliver(context.Background())
		}
	}
}

// faults, until ctx ends: every period, one write of one of kinds
// (writeKind) on a random live process loses its reply, or is held and
// delivered 50-300ms later.
func faults(ctx context.Context, wg *sync.WaitGroup, procs []*process, period time.Duration, kinds []string) *heldCopies {
	held := &heldCopies{}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(7, 7))
		tick := time.NewTicker(period)
		defer tick.Stop()
		for ctx.Err() == nil {
			<-tick.C
			p := procs[rng.IntN(len(procs))]
			if !p.alive.Load() {
				continue
			}
			k := kindIs(kinds[rng.IntN(len(kinds))])
			if rng.IntN(2) == 0 {
				p.f.DropNextReply(k)
				continue
			}
			h := p.f.HoldNext(k)
			held.add(h)
			delay := time.Duration(50+rng.IntN(250)) * time.Millisecond
			wg.Go(func() {
				select {
				case <-h.Fired():
					time.Sleep(delay)
					_, _ = h.Deliver(context.Background())
				case <-ctx.Done():
				}
			})
		}
	})
	return held
}

// sample, until ctx ends: every 100ms, the sum of balances plus pending
// entries of ids must be total. It returns the counts of agreed samples
// and of reads that never agreed.
func sample(ctx context.Context, t *testing.T, wg *sync.WaitGroup, obs *move.Mover, ids []any, total int64) (samples, unstable *atomic.Int64) {
	t.Helper()
	samples, unstable = &atomic.Int64{}, &atomic.Int64{}
	wg.Go(func() {
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			s, err := obs.Sum(context.Background(), ids...)
			if errors.Is(err, versioned.ErrConflict) {
				unstable.Add(1)
				continue
			}
			if err != nil {
				t.Errorf("Sum: %v", err)
				return
			}
			samples.Add(1)
			if s.Sum != total {
				t.Errorf("sampled sum %d (%+v), want %d", s.Sum, s, total)
			}
		}
	})
	return samples, unstable
}

// settleAll waits until no document carries move state: the relays run,
// and Sweep runs when they have no job left to do, as an operator's
// periodic Sweep finds only what no job covers (a Sweep every few hundred
// milliseconds while hundreds of jobs wait would enqueue a duplicate of
// each faster than a slow server drains them). jobs is a Queue on the
// relays' jobs collection, never run.
func (b *bundle) settleAll(t *testing.T, obs *move.Mover, jobs *deferred.Queue) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		n, err := b.db.Collection("accounts").CountDocuments(b.ctx, bson.D{{Key: "_mv.n", Value: bson.D{{Key: "$gt", Value: 0}}}})
		require.NoError(t, err)
		if n == 0 {
			break
		}
		counts, err := jobs.Counts(b.ctx)
		require.NoError(t, err)
		left := counts[deferred.StateAvailable] + counts[deferred.StateRetryable] + counts[deferred.StateRunning]
		if time.Now().After(deadline) {
			var running []bson.M
			cur, err := b.db.Collection("jobs").Find(b.ctx, bson.D{{Key: "state", Value: deferred.StateRunning}})
			require.NoError(t, err)
			require.NoError(t, cur.All(b.ctx, &running))
			t.Fatalf("%d documents still carry move state; jobs %v; running: %v", n, counts, running)
		}
		if left == 0 {
			_, err := obs.Sweep(b.ctx)
			require.NoError(t, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	b.requireNoMoveState(t)
}

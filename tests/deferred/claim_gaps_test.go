package deferred_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/observe"
)

// onEvent is an Observer that calls fn for every event but OpStart.
type onEvent func(observe.Event)

func (f onEvent) Start(ctx context.Context, _ observe.Event) context.Context { return ctx }
func (f onEvent) Observe(_ context.Context, e observe.Event)                 { f(e) }

// TestLostChangeRunThatNeverStartedIsNotCharged: a run of three queued
// changes of one document is claimed in one write, and the worker loses its
// key (cut off from the server past its lease) before the run's one write
// is made. Nothing of the run started, so it is put back like handler jobs
// that never started: with MaxAttempts 1, each job is then applied in its
// first attempt, not dead of "did not report".
func TestLostChangeRunThatNeverStartedIsNotCharged(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	var b *faultyBundle
	var once sync.Once
	cut := make(chan struct{})
	b = setupFaulty(t, &deferred.Options{VisibilityTimeout: ttl, MaxAttempts: 1, Observer: onEvent(func(e observe.Event) {
		if e.Kind == observe.JobClaimed {
			// The run is claimed: cut the worker off past its lease before
			// it starts the run (the claim's event comes before the run).
			once.Do(func() {
				b.f.Pause(2 * ttl)
				time.Sleep(2 * ttl)
				close(cut)
			})
		}
	})})
	var applied atomic.Int64
	change, err := deferred.NewChange(b.fqueue, "add", b.frepo, func(a *account, c credit) error {
		applied.Add(1)
		a.Balance += c.Amount
		a.Applied++
		return nil
	})
	require.NoError(t, err)
	b.insert(t, "ana")
	ids := []bson.ObjectID{
		enqueue(t, b.ctx, change, "ana", credit{Amount: 1, Index: 1}),
		enqueue(t, b.ctx, change, "ana", credit{Amount: 10, Index: 2}),
		enqueue(t, b.ctx, change, "ana", credit{Amount: 100, Index: 3}),
	}
	run(t, b.fqueue)
	<-cut
	for i, id := range ids {
		j := wait(t, b.obs, id)
		t.Logf("job %d: %s attempt %d mayHaveApplied %v errors %+v", i+1, j.State, j.Attempt, j.MayHaveApplied, j.Errors)
		require.Equal(t, deferred.StateCompleted, j.State, "job %d never started, yet it is %s: %+v", i+1, j.State, j.Errors)
		require.Equal(t, 1, j.Attempt, "job %d was charged for the run that never started", i+1)
	}
	b.requireAccount(t, "ana", 111, 3)
}

// oldCredit is credit as an earlier version of a program stored it: the
// amount as a string. A handler of credit cannot decode it.
type oldCredit struct {
	Amount string `bson:"amount"`
}

// TestUndecodableArgumentIsDeadAtOnce: a job whose stored argument does not
// decode into its handler's type (enqueued by another version of the
// program under the same name) fails every attempt alike: it is bad input,
// dead at once with one error that names the handler, the type and the
// decode failure, and the jobs behind it on its key run. Both for a
// handler and for a queued change, whose run is then taken one job at a
// time.
func TestUndecodableArgumentIsDeadAtOnce(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"handler", "change"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			old := b.queue(t, nil, nil)
			oldKind, err := deferred.Register(old, "add", func(context.Context, *deferred.Job, oldCredit) error { return nil })
			require.NoError(t, err)
			q := b.queue(t, nil, &deferred.Options{MaxAttempts: 5})
			var calls atomic.Int64
			var k interface {
				Enqueue(context.Context, any, credit) (bson.ObjectID, error)
			}
			b.insert(t, "ana")
			if kind == "handler" {
				k, err = deferred.Register(q, "add", func(_ context.Context, _ *deferred.Job, c credit) error {
					calls.Add(1)
					return nil
				})
			} else {
				k, err = deferred.NewChange(q, "add", b.accounts, func(a *account, c credit) error {
					calls.Add(1)
					a.Balance += c.Amount
					a.Applied++
					return nil
				})
			}
			require.NoError(t, err)
			bad := enqueue(t, b.ctx, oldKind, "ana", oldCredit{Amount: "ten"})
			good := enqueue(t, b.ctx, k, "ana", credit{Amount: 10})
			run(t, q)
			j := wait(t, q, bad)
			require.Equal(t, deferred.StateDead, j.State)
			require.Equal(t, 1, j.Attempt, "bad input fails every attempt alike: dead at once")
			require.Len(t, j.Errors, 1)
			msg := j.Errors[0].Error
			for _, want := range []string{`"add"`, "deferred_test.credit", "does not decode"} {
				require.Contains(t, msg, want, "the error names %s", want)
			}
			g := wait(t, q, good)
			require.Equal(t, deferred.StateCompleted, g.State)
			require.Equal(t, int64(1), calls.Load(), "the handler ran the good job only")
			if kind == "change" {
				b.requireAccount(t, "ana", 10, 1)
			}
		})
	}
}

// TestClaimHeldPastTheKeysLeaseNeverChargesTheJob: a worker's claim of a
// job is held in the network, and the worker is then cut off from the jobs
// (every read and write of them refused), so that it can neither settle the
// claim nor void it: it keeps the key unreleased and its lease expires.
// The key is claimed again (a later hold of the same Run: to the server,
// another holder), and right then, before the new holder reads or claims
// the job, the held copy arrives and lands. The new holder sees by the
// copy's landing time (server time, after it took the key) that its worker
// could not have started the job: the job runs once, in its first attempt,
// never marked as possibly applied (deferred/DESIGN.md, Claims of jobs,
// gap A). The copy is delivered a few milliseconds after the key's claim:
// the server's dates are in milliseconds, and a copy landing in the same
// one as the claim is rightly charged (it cannot be told from one landing
// just before).
func TestClaimHeldPastTheKeysLeaseNeverChargesTheJob(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	var heldEpoch atomic.Int64
	var blackout, delivered atomic.Bool
	var held *mongotest.Fault
	var b *faultyBundle
	var reply bson.Raw
	var deliverErr error
	b = setupFaulty(t, &deferred.Options{VisibilityTimeout: ttl, ResolveTimeout: time.Second, Observer: onEvent(func(e observe.Event) {
		// The key is claimed again after the held claim's lease: deliver
		// the copy now, on the new holder's goroutine, before it reads.
		if e.Kind == observe.LeaseAcquired && heldEpoch.Load() != 0 && e.Epoch > heldEpoch.Load() && !delivered.Swap(true) {
			blackout.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			time.Sleep(3 * time.Millisecond) // past the millisecond of the key's claim
			reply, deliverErr = held.Deliver(ctx)
		}
	})})
	var calls atomic.Int64
	k, err := deferred.Register(b.fqueue, "j", func(context.Context, *deferred.Job, int) error { calls.Add(1); return nil })
	require.NoError(t, err)
	id := enqueue(t, b.ctx, k, "x", 0)
	isClaim := jobWrite(claims)
	held = b.f.HoldNext(func(c *mongotest.Command) bool {
		if isClaim(c) {
			blackout.Store(true)
			if e, ok := statements(c)[0].Lookup("u", "$set", "epoch").AsInt64OK(); ok {
				heldEpoch.Store(e)
			}
			return true
		}
		return false
	})
	for range 300 {
		b.f.ErrorBeforeApply(func(c *mongotest.Command) bool { return blackout.Load() && c.Collection == b.jobs.Name() },
			mongotest.ServerError{Code: 2, CodeName: "BadValue", Errmsg: "mongotest: the jobs are out of reach"})
	}
	run(t, b.fqueue)
	j := wait(t, b.obs, id)
	require.True(t, delivered.Load(), "the held claim was delivered when the key was claimed again")
	require.NoError(t, deliverErr)
	n, _ := reply.Lookup("n").AsInt64OK()
	require.Equal(t, int64(1), n, "the held claim landed after the key was claimed again (the scenario): %v", reply)
	require.Equal(t, deferred.StateCompleted, j.State, "%+v", j.Errors)
	require.Equal(t, 1, j.Attempt, "the job was charged for a claim that never ran it")
	require.False(t, j.MayHaveApplied)
	require.Equal(t, int64(1), calls.Load())
}

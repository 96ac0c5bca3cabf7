package deferred_test

import (
	"context"
	"strings"
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
		j := wait(t, b.fqueue, id)
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
				require.True(t, strings.Contains(msg, want), "the error names %s: %s", want, msg)
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
// (every read and write of them refused) so that it can neither settle the
// claim nor void it: it keeps the key unreleased and its lease expires.
// A new claim of the key is made (a later hold of the same Run: to the
// server, another holder). The held copy arrives then, before the new
// holder claims the job. Where the server judges the lease's expiry, the
// claim carries the lease's fence time: the copy matches nothing, and the
// job runs once, in its first attempt, never marked as possibly applied
// (deferred/DESIGN.md, Claims of jobs, gap A).
func TestClaimHeldPastTheKeysLeaseNeverChargesTheJob(t *testing.T) {
	t.Parallel()
	mongotest.Use(t, mongotest.Expr)
	const ttl = 2 * time.Second
	b := setupFaulty(t, &deferred.Options{VisibilityTimeout: ttl, ResolveTimeout: time.Second})
	var calls atomic.Int64
	k, err := deferred.Register(b.fqueue, "j", func(context.Context, *deferred.Job, int) error { calls.Add(1); return nil })
	require.NoError(t, err)
	id := enqueue(t, b.ctx, k, "x", 0)
	var blackout atomic.Bool
	isClaim := jobWrite(claims)
	held := b.f.HoldNext(func(c *mongotest.Command) bool {
		if isClaim(c) {
			blackout.Store(true)
			return true
		}
		return false
	})
	for range 300 {
		b.f.ErrorBeforeApply(func(c *mongotest.Command) bool { return blackout.Load() && c.Collection == b.jobs.Name() },
			mongotest.ServerError{Code: 2, CodeName: "BadValue", Errmsg: "mongotest: the jobs are out of reach"})
	}
	run(t, b.fqueue)
	<-held.Fired()
	st := statements(held.Matched()[0])
	require.Len(t, st, 1)
	epoch, ok := st[0].Lookup("u", "$set", "epoch").AsInt64OK()
	require.True(t, ok)
	waitFor(t, time.Minute, "a new claim of the key", func() bool {
		var kd bson.Raw
		require.NoError(t, b.db.Collection(b.jobs.Name()+"_keys").FindOne(b.ctx, bson.D{{Key: "_id", Value: "x"}}).Decode(&kd))
		e, ok := kd.Lookup("_lease", "epoch").AsInt64OK()
		return ok && e > epoch
	})
	before, err := b.db.Collection(b.jobs.Name()).CountDocuments(b.ctx, bson.D{{Key: "_id", Value: id}, {Key: "c", Value: bson.D{{Key: "$exists", Value: false}}}})
	require.NoError(t, err)
	require.Equal(t, int64(1), before, "the claim never landed, and was never voided")
	reply, err := held.Deliver(b.ctx)
	require.NoError(t, err)
	blackout.Store(false)
	n, _ := reply.Lookup("n").AsInt64OK()
	require.Zero(t, n, "the claim landed after the key's lease expired and the key was claimed again: %v", reply)
	j := wait(t, b.fqueue, id)
	require.Equal(t, deferred.StateCompleted, j.State, "%+v", j.Errors)
	require.Equal(t, 1, j.Attempt, "the job was charged for a claim that never ran it")
	require.False(t, j.MayHaveApplied)
	require.Equal(t, int64(1), calls.Load())
}

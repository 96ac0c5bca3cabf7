package deferred_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
)

// TestLateJobClaimCannotRetakeAJob: worker A's claim of a job is held in
// the network (A hears a network error, re-reads, and its second copy is
// refused), so A gives the key up; worker B claims the key under a newer
// epoch and runs the job. When A's held copy reaches the server, it must
// not take the job back: B's attempt stays the only one, and B records it.
func TestLateJobClaimCannotRetakeAJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	qa := b.queue(t, f.Database, &deferred.Options{Owner: "A", Workers: 1, MaxAttempts: 2,
		// A looks for work again only PollInterval/10 after its failed
		// claim: time enough to stop it before it claims the key again.
		PollInterval: time.Minute})
	qb := b.queue(t, nil, &deferred.Options{Owner: "B", Workers: 1, MaxAttempts: 2})
	var aCalls, bCalls atomic.Int64
	_, err := deferred.Register(qa, "j", func(context.Context, *deferred.Job, int) error { aCalls.Add(1); return nil })
	require.NoError(t, err)
	release := make(chan struct{})
	kb, err := deferred.Register(qb, "j", func(ctx context.Context, _ *deferred.Job, _ int) error {
		bCalls.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	require.NoError(t, err)
	id := enqueue(t, b.ctx, kb, "x", 1)

	claims := mongotest.Commands([]string{"findAndModify"}, b.jobs.Name())
	held := f.HoldNext(claims)
	refused := f.ErrorBeforeApply(claims, mongotest.ServerError{Code: 2, CodeName: "BadValue"})
	stopA := run(t, qa)
	select {
	case <-refused.Fired():
	case <-time.After(time.Minute):
		t.Fatal("A's claim of the job was not held and refused within a minute")
	}
	stopA()
	require.Zero(t, aCalls.Load())
	require.True(t, held.HasFired())

	run(t, qb)
	waitFor(t, time.Minute, "B to run the job", func() bool { return bCalls.Load() == 1 })
	before, err := qb.Job(b.ctx, id)
	require.NoError(t, err)
	require.Equal(t, deferred.StateRunning, before.State)
	require.Equal(t, "B", before.Owner)
	require.Equal(t, 1, before.Attempt)

	reply, err := held.Deliver(b.ctx)
	require.NoError(t, err)
	t.Logf("A's held claim delivered: %v", reply)
	after, err := qb.Job(b.ctx, id)
	require.NoError(t, err)
	require.Equal(t, "B", after.Owner, "A's late claim took the job back from B")
	require.Equal(t, before.Epoch, after.Epoch)
	require.Equal(t, 1, after.Attempt, "A's late claim burnt an attempt")

	close(release)
	job := wait(t, qb, id)
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 1, job.Attempt)
	require.Equal(t, "B", job.Owner)
	require.Equal(t, int64(1), bCalls.Load())
	require.Zero(t, aCalls.Load())
}

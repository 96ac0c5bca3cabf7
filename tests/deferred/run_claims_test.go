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
)

// TestChangeRunPanicFailsThePanickingJob: three changes of one document
// queued before Run are one run; the third one's fn panics. "A handler's
// panic fails its attempt": the third job's, not the first's. The two
// before it did nothing wrong, and applied alone they complete; the panic
// must not be charged to the first job of the run (which, charged
// MaxAttempts times, dies, and then the second, and so on: a poison job
// kills every innocent change queued ahead of it).
func TestChangeRunPanicFailsThePanickingJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, &deferred.Options{MaxAttempts: 2})
	change, err := deferred.NewChange(q, "add", b.accounts, func(a *account, c credit) error {
		if c.Index == 3 {
			panic("poison change")
		}
		a.Balance += c.Amount
		a.Applied++
		a.Last = c.Index
		return nil
	})
	require.NoError(t, err)
	b.insert(t, "ana")
	ids := make([]bson.ObjectID, 0, 3)
	for i := range 3 {
		ids = append(ids, enqueue(t, b.ctx, change, "ana", credit{Amount: 1, Index: int64(i + 1)}))
	}
	run(t, q)
	jobs := make([]*deferred.Job, 3)
	for i, id := range ids {
		jobs[i] = wait(t, q, id)
		t.Logf("job %d: %s, attempt %d, errors %d", i+1, jobs[i].State, jobs[i].Attempt, len(jobs[i].Errors))
	}
	for i := range 2 {
		require.Equal(t, deferred.StateCompleted, jobs[i].State, "job %d never panicked, yet: %+v", i+1, jobs[i].Errors)
		require.Empty(t, jobs[i].Errors, "job %d was charged another job's panic", i+1)
	}
	require.Equal(t, deferred.StateDead, jobs[2].State)
	require.True(t, jobs[2].Errors[0].Panic)
	b.requireAccount(t, "ana", 2, 2)
}

// TestLostRunDoesNotChargeJobsThatNeverStarted: worker A claims a run of
// three handler jobs of one key in one write, and loses its claim on the
// key (cut off from the server) while the first one runs. The second and
// third never started on A. With MaxAttempts 1, worker B must still run
// them: a job that never ran is not dead of "attempt 1 of 1 did not
// report", nor marked as one that may have applied (Requeue would refuse
// it).
func TestLostRunDoesNotChargeJobsThatNeverStarted(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	b := setupFaulty(t, &deferred.Options{VisibilityTimeout: ttl, Owner: "A", MaxAttempts: 1})
	qb := b.queue(t, nil, &deferred.Options{VisibilityTimeout: ttl, Owner: "B", MaxAttempts: 1})
	var aCalls, bCalls atomic.Int64
	cut := make(chan struct{})
	var once sync.Once
	_, err := deferred.Register(b.fqueue, "j", func(ctx context.Context, _ *deferred.Job, _ int) error {
		aCalls.Add(1)
		once.Do(func() {
			b.f.Pause(2 * ttl) // A is cut off from the server from now on
			close(cut)
		})
		<-ctx.Done() // the claim lapses while A cannot renew it
		return ctx.Err()
	})
	require.NoError(t, err)
	kb, err := deferred.Register(qb, "j", func(context.Context, *deferred.Job, int) error { bCalls.Add(1); return nil })
	require.NoError(t, err)
	ids := make([]bson.ObjectID, 0, 3)
	for i := range 3 {
		ids = append(ids, enqueue(t, b.ctx, kb, "x", i+1))
	}
	run(t, b.fqueue)
	<-cut
	run(t, qb)
	jobs := make([]*deferred.Job, 3)
	for i, id := range ids {
		jobs[i] = wait(t, qb, id)
		t.Logf("job %d: %s, attempt %d, may have applied %v, errors %+v", i+1, jobs[i].State, jobs[i].Attempt, jobs[i].MayHaveApplied, jobs[i].Errors)
	}
	require.Equal(t, int64(1), aCalls.Load(), "A ran only the first job")
	for i := 1; i < 3; i++ {
		require.Equal(t, deferred.StateCompleted, jobs[i].State, "job %d never ran, yet it is %s", i+1, jobs[i].State)
		require.False(t, jobs[i].MayHaveApplied, "job %d never ran, yet it may have applied", i+1)
	}
	require.Equal(t, int64(2), bCalls.Load(), "B ran the second and third jobs")
}

// TestCancelAJobWaitingBehindARunningJob: a key's first job runs (its
// handler waits); the second, queued before Run, has not started. Cancel
// "takes a job that is waiting (available or retryable) ... out of the
// queue for good": the second job is waiting for its turn, so Cancel
// succeeds and the job never runs. Claimed with the first in one run, it
// reads as running (with a StartedAt) and Cancel refuses it.
func TestCancelAJobWaitingBehindARunningJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	started := make(chan struct{})
	release := make(chan struct{})
	var ran atomic.Int64
	k, err := deferred.Register(q, "j", func(ctx context.Context, _ *deferred.Job, i int) error {
		if i == 1 {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		} else {
			ran.Add(1)
		}
		return nil
	})
	require.NoError(t, err)
	first := enqueue(t, b.ctx, k, "x", 1)
	second := enqueue(t, b.ctx, k, "x", 2)
	run(t, q)
	<-started
	job, err := q.Job(b.ctx, second)
	require.NoError(t, err)
	t.Logf("the second job while the first runs: %s, started %v", job.State, job.StartedAt)
	cerr := q.Cancel(b.ctx, second)
	close(release)
	require.Equal(t, deferred.StateCompleted, wait(t, q, first).State)
	require.NoError(t, cerr, "a job that has not started, waiting behind the running one, could not be cancelled")
	require.Equal(t, deferred.StateCancelled, wait(t, q, second).State)
	require.Zero(t, ran.Load())
}

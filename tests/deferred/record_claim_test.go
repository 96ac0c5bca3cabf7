package deferred_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
)

// recordAndClaim matches the command of a handler's run that records a job
// and claims the next one: an update of the jobs collection with two
// statements.
func recordAndClaim(c *mongotest.Command) bool {
	if c.Name != "update" || c.Collection != "jobs" {
		return false
	}
	n := len(c.Sequences["updates"])
	if v, err := c.Body.LookupErr("updates"); err == nil {
		if a, ok := v.ArrayOK(); ok {
			vs, _ := a.Values()
			n += len(vs)
		}
	}
	return n == 2
}

// creditJobs enqueues n credits of 1, 2, 4, ... on "ana" and returns their
// ids and the balance they make together.
func creditJobs(t *testing.T, b *faultyBundle, k *deferred.Kind[credit], n int) (ids []bson.ObjectID, sum int64) {
	t.Helper()
	for i := range n {
		ids = append(ids, enqueue(t, b.ctx, k, "ana", credit{Amount: int64(1) << i}))
		sum += int64(1) << i
	}
	return ids, sum
}

// TestRecordAndNextClaimReplyLost: the command that records a handler's job
// and claims the next one lands and its reply is lost. The worker reads the
// two jobs back and goes on: every job runs once, in one attempt.
func TestRecordAndNextClaimReplyLost(t *testing.T) {
	t.Parallel()
	b, k, calls := setupCredit(t)
	ids, sum := creditJobs(t, b, k, 3)
	lost := b.f.DropNextReply(recordAndClaim)
	run(t, b.fqueue)
	for _, id := range ids {
		job := wait(t, b.fqueue, id)
		require.Equal(t, deferred.StateCompleted, job.State)
		require.Equal(t, 1, job.Attempt, "a resent claim counts no attempt")
	}
	require.True(t, lost.HasFired())
	require.Equal(t, int64(3), calls.Load())
	require.Equal(t, sum, b.get(t, "ana").Balance)
}

// TestRecordAndNextClaimLateCopy: the command that records a job and claims
// the next one is held in the network (not applied) and the worker hears a
// network error. It sends the record and the claim again; when the held copy
// reaches the server afterwards, neither of its statements matches.
func TestRecordAndNextClaimLateCopy(t *testing.T) {
	t.Parallel()
	b, k, calls := setupCredit(t)
	ids, sum := creditJobs(t, b, k, 3)
	held := b.f.HoldNext(recordAndClaim)
	run(t, b.fqueue)
	for _, id := range ids {
		job := wait(t, b.fqueue, id)
		require.Equal(t, deferred.StateCompleted, job.State)
		require.Equal(t, 1, job.Attempt)
	}
	require.True(t, held.HasFired())
	reply, err := held.Deliver(b.ctx)
	require.NoError(t, err)
	n, ok := reply.Lookup("n").AsInt64OK()
	require.True(t, ok, "reply %v", reply)
	require.Zero(t, n, "the late copy applied: %v", reply)
	for _, id := range ids {
		job := wait(t, b.fqueue, id)
		require.Equal(t, deferred.StateCompleted, job.State)
		require.Equal(t, 1, job.Attempt)
	}
	require.Equal(t, int64(3), calls.Load())
	require.Equal(t, sum, b.get(t, "ana").Balance)
}

// TestJobCancelledWhileTheOneBeforeItRuns: the job after the running one is
// cancelled while its handler runs, so the command that records the running
// job and claims the next finds the next one gone: it is never run, and the
// job behind it is.
func TestJobCancelledWhileTheOneBeforeItRuns(t *testing.T) {
	t.Parallel()
	b := setupFaulty(t, nil)
	var calls atomic.Int64
	var second bson.ObjectID
	k, err := deferred.Register(b.fqueue, "credit", func(ctx context.Context, job *deferred.Job, c credit) error {
		calls.Add(1)
		if c.Amount == 1 {
			require.NoError(t, b.fqueue.Cancel(ctx, second))
		}
		_, err := deferred.Guarded(ctx, job, b.frepo, "ana", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}}}})
		return err
	})
	require.NoError(t, err)
	b.insert(t, "ana")
	ids, _ := creditJobs(t, b, k, 3)
	second = ids[1]
	var combined atomic.Int64
	counter := b.f.DelayReplies(time.Nanosecond, func(c *mongotest.Command) bool {
		if recordAndClaim(c) {
			combined.Add(1)
		}
		return false
	})
	defer counter()
	run(t, b.fqueue)
	require.Equal(t, deferred.StateCompleted, wait(t, b.fqueue, ids[0]).State)
	require.Equal(t, deferred.StateCancelled, wait(t, b.fqueue, ids[1]).State)
	job := wait(t, b.fqueue, ids[2])
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 1, job.Attempt)
	require.Equal(t, int64(2), calls.Load())
	require.Equal(t, int64(1+4), b.get(t, "ana").Balance)
	require.Positive(t, combined.Load(), "the record of the first job carried the claim of the second")
}

package deferred_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
)

// Requeue's answers: nil put the job back in the queue; an error other than
// an *UnknownOutcomeError changed nothing.

// cancelledJob enqueues a credit to "ana" through q, cancels it before it
// runs, starts q's worker and waits for the key to move past it; it
// returns the job's id and its stored document.
func cancelledJob(t *testing.T, b *bundle, q *deferred.Queue) (bson.ObjectID, bson.M) {
	t.Helper()
	k := registerCredit(t, q, b.accounts, new(atomic.Int64))
	id := enqueue(t, b.ctx, k, "ana", credit{Amount: 7})
	require.NoError(t, q.Cancel(b.ctx, id))
	run(t, q)
	waitFor(t, time.Minute, "the key to pass the cancelled job", func() bool {
		var kd struct{ N int64 }
		err := q.Keys().FindOne(b.ctx, bson.D{{Key: "_id", Value: "ana"}}).Decode(&kd)
		return err == nil && kd.N == 0
	})
	var doc bson.M
	require.NoError(t, b.jobs.FindOne(b.ctx, bson.D{{Key: "_id", Value: id}}).Decode(&doc))
	require.Equal(t, string(deferred.StateCancelled), doc["state"])
	require.NotNil(t, doc["expireAt"])
	return id, doc
}

// TestRequeueLostReplyNeverDeniesTheRequeue: Requeue's update lands, its
// reply is lost, and the first re-read fails. The job is back in the queue
// and runs: the answer must be nil or an unknown outcome naming the job,
// never a plain error (it was one, and the job ran).
func TestRequeueLostReplyNeverDeniesTheRequeue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	b.insert(t, "ana")
	q := b.queue(t, nil, nil)
	id, _ := cancelledJob(t, b, q)
	fq := b.queue(t, f.Database, nil)
	registerCredit(t, fq, b.accounts, new(atomic.Int64))
	_, err := fq.EnsureIndexes(b.ctx)
	require.NoError(t, err)

	var landed atomic.Bool
	updates := mongotest.Commands([]string{"update"}, "jobs")
	lost := f.DropNextReply(func(c *mongotest.Command) bool {
		if updates(c) {
			landed.Store(true) // runs after the server applied it
			return true
		}
		return false
	})
	finds := mongotest.Commands([]string{"find"}, "jobs")
	readFails := f.ErrorBeforeApply(func(c *mongotest.Command) bool { return landed.Load() && finds(c) },
		mongotest.ServerError{Code: 13, CodeName: "Unauthorized"})
	err = fq.Requeue(b.ctx, id)
	t.Logf("Requeue returned %v", err)
	require.True(t, lost.HasFired())
	require.True(t, readFails.HasFired(), "the re-read after the lost reply failed")

	var uoe *deferred.UnknownOutcomeError
	switch {
	case err == nil:
	case errors.As(err, &uoe):
		require.ErrorIs(t, err, deferred.ErrUnknownOutcome)
		require.Equal(t, "requeue", uoe.Op)
		require.Equal(t, id, uoe.ID)
	default:
		requireOneDeferredPrefix(t, err)
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			job, jerr := q.Job(b.ctx, id)
			require.NoError(t, jerr)
			require.Equal(t, deferred.StateCancelled, job.State, "Requeue returned %v, yet the job was requeued", err)
			require.Zero(t, b.get(t, "ana").Applied)
		}
		return
	}
	require.Equal(t, deferred.StateCompleted, wait(t, q, id).State)
	require.Equal(t, int64(1), b.get(t, "ana").Applied, "the requeued job ran once")
}

// TestRequeueTakenBackKeepsItsExpiry: a Requeue whose new place was skipped
// while its reservation was slow (the tombstone gone by then) puts the job
// back as it was, and then fails here (its next read is refused). A
// cancelled job put back must keep its expireAt, or it is never deleted; it
// lost it.
func TestRequeueTakenBackKeepsItsExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	b.insert(t, "ana")
	opts := &deferred.Options{HoleTimeout: 300 * time.Millisecond}
	q := b.queue(t, nil, opts)
	id, before := cancelledJob(t, b, q)
	fq := b.queue(t, f.Database, opts)
	registerCredit(t, fq, b.accounts, new(atomic.Int64))
	_, err := fq.EnsureIndexes(b.ctx)
	require.NoError(t, err)

	stop := f.DelayReplies(reservationDelay, mongotest.Commands([]string{"findAndModify"}, "jobs_keys"))
	defer stop()
	// The second update of the job is the take-back; refuse the next read
	// of the jobs after it, so that Requeue ends there.
	var n atomic.Int64
	updates, finds := mongotest.Commands([]string{"update"}, "jobs"), mongotest.Commands([]string{"find"}, "jobs")
	readFails := f.ErrorBeforeApply(func(c *mongotest.Command) bool {
		if updates(c) {
			n.Add(1)
			return false
		}
		return n.Load() >= 2 && finds(c)
	}, mongotest.ServerError{Code: 13, CodeName: "Unauthorized"})
	done := make(chan error, 1)
	go func() { done <- fq.Requeue(b.ctx, id) }()
	skipped := bson.D{{Key: "state", Value: "skipped"}}
	skippedPast(t, b, "ana", skipped)
	_, err = b.jobs.DeleteOne(b.ctx, skipped)
	require.NoError(t, err)
	stop()
	err = <-done
	t.Logf("Requeue returned %v", err)
	require.True(t, readFails.HasFired(), "Requeue was stopped after the take-back")
	require.Error(t, err)
	require.NotErrorIs(t, err, deferred.ErrUnknownOutcome, "the take-back settled it")
	requireOneDeferredPrefix(t, err)

	var after bson.M
	require.NoError(t, b.jobs.FindOne(b.ctx, bson.D{{Key: "_id", Value: id}}).Decode(&after))
	for _, field := range []string{"state", "s", "attempt", "finished", "expireAt"} {
		require.Equal(t, before[field], after[field], "%s: the job is as it was", field)
	}
	require.Zero(t, b.get(t, "ana").Applied)
}

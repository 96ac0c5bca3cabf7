package deferred_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
)

// The answers Enqueue and Requeue promise: an error other than an
// *UnknownOutcomeError means nothing was stored (nothing changed), so the
// only honest answers once a write may have landed are success or an
// *UnknownOutcomeError naming the job. Each test here provokes one path
// where a write landed, or may land later, and checks the answer against
// what the queue then does.

// requireEnqueueKeptItsWord requires of Enqueue's answer (id, err) for one
// credit to the account "ana" what the doc promises, given the running
// worker q: the job's id, or an *UnknownOutcomeError whose ID is the
// job's, and then that job runs exactly once; or another error, and then
// no job is stored and none runs (watched for 3 s).
func requireEnqueueKeptItsWord(t *testing.T, b *bundle, q *deferred.Queue, id bson.ObjectID, err error) {
	t.Helper()
	var uoe *deferred.UnknownOutcomeError
	switch {
	case err == nil:
		require.False(t, id.IsZero())
	case errors.As(err, &uoe):
		require.ErrorIs(t, err, deferred.ErrUnknownOutcome)
		require.Equal(t, "enqueue", uoe.Op)
		jobID, ok := uoe.ID.(bson.ObjectID)
		require.True(t, ok, "the job's id: %v", uoe.ID)
		require.False(t, jobID.IsZero())
		requireOneDeferredPrefix(t, err)
		id = jobID
	default:
		requireOneDeferredPrefix(t, err)
		jobs := bson.D{{Key: "state", Value: bson.D{{Key: "$ne", Value: "skipped"}}}}
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			n, cerr := b.jobs.CountDocuments(b.ctx, jobs)
			require.NoError(t, cerr)
			require.Zero(t, n, "Enqueue returned %v, yet a job is stored", err)
			require.Zero(t, b.get(t, "ana").Applied, "Enqueue returned %v, yet a job ran", err)
		}
		return
	}
	job := wait(t, q, id)
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, int64(1), b.get(t, "ana").Applied, "the job ran once")
	n, cerr := b.jobs.CountDocuments(b.ctx, bson.D{{Key: "state", Value: bson.D{{Key: "$ne", Value: "skipped"}}}})
	require.NoError(t, cerr)
	require.Equal(t, int64(1), n, "one job stored, the one named")
}

// requireOneDeferredPrefix requires err's message to start with
// "deferred: " and name the package once (the injected faults' own messages
// may repeat: they are causes, joined).
func requireOneDeferredPrefix(t testing.TB, err error) {
	t.Helper()
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), "deferred: "), err.Error())
	require.Equal(t, 1, strings.Count(err.Error(), "deferred: "), err.Error())
}

// TestEnqueueSlowCheckFailureNeverDeniesTheJob: an enqueue whose
// reservation took HoleTimeout/2 or more re-reads the key after its insert
// landed (is it behind the head?). When that read fails, the job is stored:
// the answer must be its id or an unknown outcome naming it, never a plain
// error (it was one, and the job ran).
func TestEnqueueSlowCheckFailureNeverDeniesTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	b.insert(t, "ana")
	fq := b.queue(t, f.Database, nil) // fast(): HoleTimeout 500ms
	registerCredit(t, fq, b.accounts, new(atomic.Int64))
	_, err := fq.EnsureIndexes(b.ctx)
	require.NoError(t, err)
	stop := f.DelayReplies(400*time.Millisecond, mongotest.Commands([]string{"findAndModify"}, "jobs_keys"))
	readFails := f.ErrorBeforeApply(mongotest.Commands([]string{"find"}, "jobs_keys"),
		mongotest.ServerError{Code: 13, CodeName: "Unauthorized"})
	id, err := fq.Enqueue(b.ctx, "credit", "ana", credit{Amount: 7})
	stop()
	require.True(t, readFails.HasFired(), "the slow insert's check was refused")
	t.Logf("Enqueue returned %v, %v", id.Hex(), err)

	q := b.queue(t, nil, nil) // another process works the queue
	registerCredit(t, q, b.accounts, new(atomic.Int64))
	run(t, q)
	requireEnqueueKeptItsWord(t, b, q, id, err)
}

// TestEnqueueRefusedResendNeverDeniesTheJob: the job's insert fails
// ambiguously (its copy held in the network), the re-read finds nothing,
// the resend is refused with an error that is not ambiguous (a primary that
// stepped down, no RetryableWriteError label), and so is the tombstone that
// would settle it. The held copy can still land, so the answer must be an
// unknown outcome naming the job (it was a plain error, and the job ran).
func TestEnqueueRefusedResendNeverDeniesTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	b.insert(t, "ana")
	fq := b.queue(t, f.Database, nil)
	registerCredit(t, fq, b.accounts, new(atomic.Int64))
	_, err := fq.EnsureIndexes(b.ctx)
	require.NoError(t, err)
	inserts := mongotest.Commands([]string{"insert"}, "jobs")
	held := f.HoldNext(inserts)
	nwp := mongotest.ServerError{Code: 10107, CodeName: "NotWritablePrimary"}
	resend := f.ErrorBeforeApply(inserts, nwp)
	tomb := f.ErrorBeforeApply(inserts, nwp)
	id, err := fq.Enqueue(b.ctx, "credit", "ana", credit{Amount: 7})
	require.True(t, held.HasFired())
	require.True(t, resend.HasFired())
	require.True(t, tomb.HasFired(), "the tombstone was refused too")
	t.Logf("Enqueue returned %v, %v", id.Hex(), err)
	_, err2 := held.Deliver(b.ctx) // the held copy lands late
	require.NoError(t, err2)

	q := b.queue(t, nil, nil)
	registerCredit(t, q, b.accounts, new(atomic.Int64))
	run(t, q)
	requireEnqueueKeptItsWord(t, b, q, id, err)
}

// TestEnqueueLostTakeBackNeverStrandsTheJob: a slow insert that landed
// behind its key's head (its number skipped, the tombstone gone) is taken
// back (deleted) and enqueued again at a new number. When that delete is
// lost in the network (not applied), the job must not be left where no
// worker looks while Enqueue answers a plain error: it was, and the job
// never ran.
func TestEnqueueLostTakeBackNeverStrandsTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	b.insert(t, "ana")
	opts := &deferred.Options{HoleTimeout: 300 * time.Millisecond}
	q := b.queue(t, nil, opts)
	fq := b.queue(t, f.Database, opts)
	registerCredit(t, q, b.accounts, new(atomic.Int64))
	registerCredit(t, fq, b.accounts, new(atomic.Int64))
	_, err := fq.EnsureIndexes(b.ctx)
	require.NoError(t, err)
	run(t, q)
	stop := f.DelayReplies(reservationDelay, mongotest.Commands([]string{"findAndModify"}, "jobs_keys"))
	defer stop()
	held := f.HoldNext(mongotest.Commands([]string{"delete"}, "jobs"))
	type result struct {
		id  bson.ObjectID
		err error
	}
	done := make(chan result, 1)
	go func() {
		id, err := fq.Enqueue(b.ctx, "credit", "ana", credit{Amount: 7})
		done <- result{id, err}
	}()
	skipped := bson.D{{Key: "state", Value: "skipped"}}
	skippedPast(t, b, "ana", skipped)
	_, err = b.jobs.DeleteOne(b.ctx, skipped) // retention over: the insert lands behind the head
	require.NoError(t, err)
	stop()
	r := <-done
	t.Logf("Enqueue returned %v, %v", r.id.Hex(), r.err)
	require.True(t, held.HasFired(), "the take-back's delete was lost (never delivered)")
	requireEnqueueKeptItsWord(t, b, q, r.id, r.err)
}

// reservationDelay is how long a test that makes the worker skip a number
// holds the replies of the enqueuer's findAndModify commands on the keys,
// the reservation's among them, unless it ends the delay once it saw the
// skip (DelayReplies' stop): the worker must skip the number before the
// reservation's reply goes on (a poll, HoleTimeout, and its writes: 3 s was
// too short once, with two packages' tests running on DocumentDB). A key's
// first enqueue waits it whole: its first findAndModify finds no key
// document, and that reply is held too, before the reservation is sent.
const reservationDelay = 10 * time.Second

// skippedPast waits until a worker skipped the number a slow write
// reserved on "ana" (its tombstone, matched by skipped, is there) and moved
// the key's head past it: deleting the tombstone before that would have
// the worker find the hole again and write a second one.
func skippedPast(t *testing.T, b *bundle, key string, skipped bson.D) {
	t.Helper()
	waitFor(t, time.Minute, "the number to be skipped and passed", func() bool {
		n, err := b.jobs.CountDocuments(b.ctx, skipped)
		var kd struct{ N int64 }
		kerr := b.db.Collection("jobs_keys").FindOne(b.ctx, bson.D{{Key: "_id", Value: key}}).Decode(&kd)
		return err == nil && n == 1 && kerr == nil && kd.N == 0
	})
}

package deferred_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/tests/internal/errmsg"
)

// TestBadInput: every refusal is typed, and nothing is stored: no job, no
// key document.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	credits := creditHandler(t, b, q)
	var nilCtx context.Context // the input under test

	cases := []struct {
		name string
		do   func() error
		want error
	}{
		{"unknown handler", func() error { _, err := q.Enqueue(b.ctx, "debit", "ana", credit{}); return err }, deferred.ErrInvalid},
		{"operator-shaped name", func() error { _, err := q.Enqueue(b.ctx, "$where", "ana", credit{}); return err }, deferred.ErrInvalid},
		{"args of another type", func() error { _, err := q.Enqueue(b.ctx, "credit", "ana", 5); return err }, deferred.ErrInvalid},
		{"args that do not encode", func() error {
			_, err := deferred.Register(q, "chan", func(context.Context, *deferred.Job, chan int) error { return nil })
			require.NoError(t, err)
			_, err = q.Enqueue(b.ctx, "chan", "ana", make(chan int))
			return err
		}, deferred.ErrInvalid},
		{"args with an operator key", func() error {
			_, err := deferred.Register(q, "map", func(context.Context, *deferred.Job, map[string]int) error { return nil })
			require.NoError(t, err)
			_, err = q.Enqueue(b.ctx, "map", "ana", map[string]int{"$inc": 1})
			return err
		}, deferred.ErrInvalid},
		{"args with a dotted key", func() error { _, err := q.Enqueue(b.ctx, "map", "ana", map[string]int{"a.b": 1}); return err }, deferred.ErrInvalid},
		{"nil ctx", func() error { _, err := credits.Enqueue(nilCtx, "ana", credit{}); return err }, deferred.ErrInvalid},
		{"nil ctx, unknown name", func() error { _, err := q.Enqueue(nilCtx, "nope", "ana", credit{}); return err }, deferred.ErrInvalid},
		{"nil key", func() error { _, err := credits.Enqueue(b.ctx, nil, credit{}); return err }, deferred.ErrInvalidID},
		{"empty key", func() error { _, err := credits.Enqueue(b.ctx, "", credit{}); return err }, deferred.ErrInvalidID},
		{"operator key", func() error {
			_, err := credits.Enqueue(b.ctx, bson.D{{Key: "$gt", Value: ""}}, credit{})
			return err
		}, deferred.ErrInvalidID},
		{"regex key", func() error {
			_, err := credits.Enqueue(b.ctx, bson.Regex{Pattern: ".*"}, credit{})
			return err
		}, deferred.ErrInvalidID},
		{"array key", func() error { _, err := credits.Enqueue(b.ctx, bson.A{"a"}, credit{}); return err }, deferred.ErrInvalidID},
	}
	for _, c := range cases {
		err := c.do()
		require.ErrorIs(t, err, c.want, c.name)
		require.ErrorIs(t, err, deferred.ErrInvalid, c.name)
		require.ErrorIs(t, err, store.ErrInvalid, c.name)
		var ie *deferred.InvalidError
		require.ErrorAs(t, err, &ie, c.name)
		errmsg.RequireOnePrefix(t, err)
	}
	cancelled, cancel := context.WithCancel(b.ctx)
	cancel()
	_, err := credits.Enqueue(cancelled, "ana", credit{})
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, deferred.ErrInvalid, "an ended context is the caller's, not bad input")

	for _, coll := range []string{"jobs", "jobs_keys"} {
		n, err := b.db.Collection(coll).CountDocuments(b.ctx, bson.D{})
		require.NoError(t, err)
		require.Zero(t, n, "%s: nothing stored", coll)
	}

	// Registration and options.
	_, err = deferred.Register(q, "credit", func(context.Context, *deferred.Job, credit) error { return nil })
	require.ErrorIs(t, err, deferred.ErrInvalid, "registered twice")
	_, err = deferred.Register(q, "", func(context.Context, *deferred.Job, credit) error { return nil })
	require.ErrorIs(t, err, deferred.ErrInvalid)
	_, err = deferred.Register[credit](q, "x", nil)
	require.ErrorIs(t, err, deferred.ErrInvalid)
	_, err = deferred.New(nil, nil)
	require.ErrorIs(t, err, deferred.ErrInvalid)
	_, err = deferred.New(b.jobs, &deferred.Options{FenceField: "$x"})
	require.ErrorIs(t, err, deferred.ErrInvalid)
	_, err = deferred.New(b.jobs, &deferred.Options{VisibilityTimeout: -time.Second})
	require.ErrorIs(t, err, deferred.ErrInvalid)
	_, err = deferred.New(b.jobs, &deferred.Options{Backoff: retry.Policy{Multiplier: 0.5}})
	require.ErrorIs(t, err, deferred.ErrInvalid)
	empty, err := deferred.New(b.db.Collection("empty"), nil)
	require.NoError(t, err)
	require.ErrorIs(t, empty.Run(b.ctx), deferred.ErrInvalid, "Run with no handler")
	require.ErrorIs(t, q.Run(nilCtx), deferred.ErrInvalid)
	_, err = q.Job(b.ctx, bson.NewObjectID())
	require.ErrorIs(t, err, deferred.ErrNotFound)
}

// TestDeadAfterMaxAttempts: a handler that keeps failing is tried
// MaxAttempts times, with backoff, and the job goes dead with every error
// recorded; the key moves on to its next job. Requeue runs it again (at the
// tail of its key); Cancel takes a dead job out for good.
func TestDeadAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, &deferred.Options{MaxAttempts: 3})
	b.insert(t, "ana")
	var failing atomic.Bool
	failing.Store(true)
	var calls atomic.Int64
	k, err := deferred.Register(q, "credit", func(ctx context.Context, job *deferred.Job, c credit) error {
		calls.Add(1)
		if failing.Load() && c.Index == 1 {
			return errors.New("partner says no")
		}
		_, err := deferred.Guarded(ctx, job, b.accounts, "ana", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}}})
		return err
	})
	require.NoError(t, err)
	doomed := enqueue(t, b.ctx, k, "ana", credit{Amount: 1, Index: 1})
	next := enqueue(t, b.ctx, k, "ana", credit{Amount: 10, Index: 2})
	run(t, q)

	job := wait(t, q, doomed)
	require.Equal(t, deferred.StateDead, job.State)
	require.Equal(t, 3, job.Attempt)
	require.Len(t, job.Errors, 3)
	for i, e := range job.Errors {
		require.Equal(t, i+1, e.Attempt)
		require.Equal(t, "partner says no", e.Error)
		require.False(t, e.At.IsZero())
	}
	require.Equal(t, deferred.StateCompleted, wait(t, q, next).State, "the key moved on")
	require.Equal(t, int64(10), b.get(t, "ana").Balance)
	counts, err := q.Counts(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), counts[deferred.StateDead])
	require.Equal(t, int64(1), counts[deferred.StateCompleted])

	require.ErrorIs(t, q.Cancel(b.ctx, next), deferred.ErrState, "a completed job cannot be cancelled")
	require.ErrorIs(t, q.Requeue(b.ctx, next), deferred.ErrState, "nor requeued")

	failing.Store(false)
	require.NoError(t, q.Requeue(b.ctx, doomed))
	job = wait(t, q, doomed)
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 1, job.Attempt, "attempts count from zero again")
	require.Len(t, job.Errors, 3, "the old errors stay")
	require.Equal(t, int64(11), b.get(t, "ana").Balance)

	// Cancel a dead job.
	failing.Store(true)
	again := enqueue(t, b.ctx, k, "ana", credit{Amount: 100, Index: 1})
	require.Equal(t, deferred.StateDead, wait(t, q, again).State)
	require.NoError(t, q.Cancel(b.ctx, again))
	job, err = q.Job(b.ctx, again)
	require.NoError(t, err)
	require.Equal(t, deferred.StateCancelled, job.State)
	require.Equal(t, int64(11), b.get(t, "ana").Balance)
	require.ErrorIs(t, q.Cancel(b.ctx, bson.NewObjectID()), deferred.ErrNotFound)
}

// TestPermanentErrorDiesAtOnce: retry.Permanent makes the job dead on its
// first attempt.
func TestPermanentErrorDiesAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	k, err := deferred.Register(q, "nope", func(context.Context, *deferred.Job, int) error {
		return retry.Permanent(errors.New("declined"))
	})
	require.NoError(t, err)
	id := enqueue(t, b.ctx, k, "x", 1)
	run(t, q)
	job := wait(t, q, id)
	require.Equal(t, deferred.StateDead, job.State)
	require.Equal(t, 1, job.Attempt)
}

// TestPanicFailsTheAttempt: a handler that panics fails that attempt (the
// panic and its stack are recorded); the worker lives on and runs the
// next attempt and other jobs.
func TestPanicFailsTheAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	var calls atomic.Int64
	k, err := deferred.Register(q, "boom", func(_ context.Context, _ *deferred.Job, i int) error {
		if i == 1 && calls.Add(1) == 1 {
			panic(errors.New("handler bug"))
		}
		return nil
	})
	require.NoError(t, err)
	first := enqueue(t, b.ctx, k, "x", 1)
	other := enqueue(t, b.ctx, k, "y", 2)
	run(t, q)
	job := wait(t, q, first)
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 2, job.Attempt)
	require.True(t, job.Errors[0].Panic)
	require.Contains(t, job.Errors[0].Error, "handler bug")
	require.Contains(t, job.Errors[0].Error, "goroutine", "with its stack")
	require.Equal(t, deferred.StateCompleted, wait(t, q, other).State)
}

// recorder records the order handlers ran in, across goroutines.
type recorder struct {
	mu  sync.Mutex
	got []int
}

func (r *recorder) add(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, i)
}

func (r *recorder) list() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// TestSnooze: a handler that snoozes runs again later without counting the
// attempt, and holds its key meanwhile.
func TestSnooze(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, &deferred.Options{MaxAttempts: 1})
	var calls atomic.Int64
	var order recorder
	k, err := deferred.Register(q, "wait", func(_ context.Context, _ *deferred.Job, i int) error {
		if i == 1 && calls.Add(1) <= 3 {
			return deferred.Snooze(20 * time.Millisecond)
		}
		order.add(i)
		return nil
	})
	require.NoError(t, err)
	id1 := enqueue(t, b.ctx, k, "x", 1)
	id2 := enqueue(t, b.ctx, k, "x", 2)
	run(t, q)
	job := wait(t, q, id1)
	require.Equal(t, deferred.StateCompleted, job.State, "snoozes are not attempts (MaxAttempts 1)")
	require.Equal(t, 1, job.Attempt)
	require.Equal(t, deferred.StateCompleted, wait(t, q, id2).State)
	require.Equal(t, []int{1, 2}, order.list())
}

// TestHoleIsSkipped: an enqueuer that reserved a sequence number and died
// before inserting its job leaves a hole; the key waits HoleTimeout for it,
// then skips it, and its later jobs run.
func TestHoleIsSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	fq := b.queue(t, f.Database, nil)
	q := b.queue(t, nil, &deferred.Options{HoleTimeout: 300 * time.Millisecond})
	var order recorder
	for _, queue := range []*deferred.Queue{fq, q} {
		_, err := deferred.Register(queue, "seq", func(_ context.Context, _ *deferred.Job, i int) error {
			order.add(i)
			return nil
		})
		require.NoError(t, err)
	}
	id1, err := q.Enqueue(b.ctx, "seq", "x", 1)
	require.NoError(t, err)
	// The reservation lands and the enqueuer hears an error: it gives up
	// before inserting its job, as if it died between its two writes.
	fault := f.ErrorAfterApply(mongotest.Commands([]string{"findAndModify"}, "jobs_keys"), mongotest.ServerError{Code: 2, CodeName: "BadValue"})
	_, err = fq.Enqueue(b.ctx, "seq", "x", 2)
	require.Error(t, err)
	require.True(t, fault.HasFired())
	id3, err := q.Enqueue(b.ctx, "seq", "x", 3)
	require.NoError(t, err)
	run(t, q)
	require.Equal(t, deferred.StateCompleted, wait(t, q, id1).State)
	require.Equal(t, deferred.StateCompleted, wait(t, q, id3).State)
	require.Equal(t, []int{1, 3}, order.list())
	n, err := b.jobs.CountDocuments(b.ctx, bson.D{{Key: "state", Value: "skipped"}})
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "one tombstone")
}

// TestEnqueueReplyLost: each write of an enqueue lands and its reply is
// lost (the job's insert, the reservation, the insert of a new key's
// document); the enqueuer re-reads, finds it, and reports the job stored,
// once.
func TestEnqueueReplyLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	q := b.queue(t, f.Database, nil)
	k, err := deferred.Register(q, "n", func(context.Context, *deferred.Job, int) error { return nil })
	require.NoError(t, err)
	for _, c := range []struct{ cmd, coll, key string }{
		{"insert", "jobs", "x"},             // the job (x's document is made first, its reply kept)
		{"findAndModify", "jobs_keys", "x"}, // the reservation
		{"insert", "jobs_keys", "y"},        // the document of a key's first enqueue
	} {
		fault := f.DropNextReply(mongotest.Commands([]string{c.cmd}, c.coll))
		id, err := k.Enqueue(b.ctx, c.key, 1)
		require.NoError(t, err, "%s %s", c.cmd, c.coll)
		require.Len(t, fault.Dropped(), 1, "%s %s", c.cmd, c.coll)
		job, err := q.Job(b.ctx, id)
		require.NoError(t, err)
		require.Equal(t, deferred.StateAvailable, job.State)
	}
	n, err := b.jobs.CountDocuments(b.ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	for _, key := range []string{"x", "y"} {
		var kd struct{ Tail, N int64 }
		require.NoError(t, q.Keys().FindOne(b.ctx, bson.D{{Key: "_id", Value: key}}).Decode(&kd))
		require.Equal(t, kd.Tail, kd.N, "%s: every number reserved waits", key)
	}
}

// TestSweepAndTTL: completed jobs are deleted after Retention: by the TTL
// index where the server has one, else by Run's sweep.
func TestSweepAndTTL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, &deferred.Options{Retention: 100 * time.Millisecond})
	k, err := deferred.Register(q, "n", func(context.Context, *deferred.Job, int) error { return nil })
	require.NoError(t, err)
	ttl, err := q.EnsureIndexes(b.ctx)
	require.NoError(t, err)
	require.Equal(t, b.db.Caps().TTLIndexes, ttl)
	id := enqueue(t, b.ctx, k, "x", 1)
	run(t, q)
	require.Equal(t, deferred.StateCompleted, wait(t, q, id).State)
	if ttl {
		t.Log("TTL index: the server deletes the job (its monitor runs about once a minute)")
	}
	waitFor(t, 3*time.Minute, "the completed job to be deleted", func() bool {
		time.Sleep(100 * time.Millisecond)
		_, err := q.Job(b.ctx, id)
		return errors.Is(err, deferred.ErrNotFound)
	})
	n, err := q.Sweep(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestEnqueueInTransaction: inside a transaction the enqueue is part of it:
// aborted, nothing is stored. Neither test backend has transactions: this
// runs against a replica set (MONGODB_URI or Docker) and is skipped, with
// the reason, elsewhere.
func TestEnqueueInTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.Require(t, mongotest.Transactions)
	q := b.queue(t, nil, nil)
	k, err := deferred.Register(q, "n", func(context.Context, *deferred.Job, int) error { return nil })
	require.NoError(t, err)
	_, err = q.EnsureIndexes(b.ctx)
	require.NoError(t, err)
	sess, err := b.db.Client().StartSession()
	require.NoError(t, err)
	defer sess.EndSession(b.ctx)
	abort := errors.New("abort")
	_, err = sess.WithTransaction(b.ctx, func(ctx context.Context) (any, error) {
		if _, err := b.db.Collection("orders").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
			return nil, err
		}
		if _, err := k.Enqueue(ctx, "x", 1); err != nil {
			return nil, err
		}
		return nil, abort
	})
	require.ErrorIs(t, err, abort)
	for _, coll := range []string{"orders", "jobs"} {
		n, err := b.db.Collection(coll).CountDocuments(b.ctx, bson.D{})
		require.NoError(t, err)
		require.Zero(t, n, coll)
	}
	var id bson.ObjectID
	_, err = sess.WithTransaction(b.ctx, func(ctx context.Context) (any, error) {
		_, err := b.db.Collection("orders").InsertOne(ctx, bson.D{{Key: "_id", Value: 2}})
		if err == nil {
			id, err = k.Enqueue(ctx, "x", 2)
		}
		return nil, err
	})
	require.NoError(t, err)
	_, err = q.Job(b.ctx, id)
	require.NoError(t, err)
}

// TestStopPutsTheJobBack: when Run's context ends while a handler runs, the
// handler's context ends, the job goes back to available without counting
// the attempt, and the next Run completes it.
func TestStopPutsTheJobBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, &deferred.Options{MaxAttempts: 1})
	started := make(chan struct{})
	var calls atomic.Int64
	k, err := deferred.Register(q, "slow", func(ctx context.Context, _ *deferred.Job, _ int) error {
		if calls.Add(1) == 1 {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	require.NoError(t, err)
	id := enqueue(t, b.ctx, k, "x", 1)
	stop := run(t, q)
	<-started
	stop()
	job, err := q.Job(b.ctx, id)
	require.NoError(t, err)
	require.Equal(t, deferred.StateAvailable, job.State)
	require.Zero(t, job.Attempt)
	require.Empty(t, job.Errors)
	run(t, q)
	job = wait(t, q, id)
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 1, job.Attempt)
}

// TestSlowEnqueue: the reply of an enqueue's reservation is delayed past
// HoleTimeout: the workers skip its number (a tombstone). The insert then
// fails on the tombstone and the enqueue takes the next number; or, when the
// tombstone is gone by then (deleted after its retention), the insert lands
// behind the key's head, and the enqueue sees it, takes the job back and
// enqueues it again. Either way the job runs, once.
func TestSlowEnqueue(t *testing.T) {
	t.Parallel()
	for _, gone := range []bool{false, true} {
		t.Run(map[bool]string{false: "tombstone there", true: "tombstone gone"}[gone], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			f := b.db.Faulty(t, nil)
			q := b.queue(t, nil, &deferred.Options{HoleTimeout: 300 * time.Millisecond})
			fq := b.queue(t, f.Database, &deferred.Options{HoleTimeout: 300 * time.Millisecond})
			var order recorder
			for _, queue := range []*deferred.Queue{q, fq} {
				_, err := deferred.Register(queue, "seq", func(_ context.Context, _ *deferred.Job, i int) error {
					order.add(i)
					return nil
				})
				require.NoError(t, err)
			}
			_, err := fq.EnsureIndexes(b.ctx)
			require.NoError(t, err)
			run(t, q)
			stop := f.DelayReplies(reservationDelay, mongotest.Commands([]string{"findAndModify"}, "jobs_keys"))
			defer stop()
			type result struct {
				id  bson.ObjectID
				err error
			}
			done := make(chan result, 1)
			go func() {
				id, err := fq.Enqueue(b.ctx, "seq", "x", 1)
				done <- result{id, err}
			}()
			skipped := bson.D{{Key: "state", Value: "skipped"}}
			// Skipped, and the head moved past it: deleting the tombstone
			// before would let the worker find the hole again.
			skippedPast(t, b, "x", skipped)
			if gone {
				_, err := b.jobs.DeleteOne(b.ctx, skipped)
				require.NoError(t, err)
			}
			stop() // the replies flow again
			r := <-done
			require.NoError(t, r.err)
			job := wait(t, q, r.id)
			require.Equal(t, deferred.StateCompleted, job.State)
			require.Equal(t, []int{1}, order.list())
			// The worker moves the key's head in a write of its own after
			// it records the job: wait for it, never read once.
			kd := struct{ Off, Tail, Done, N int64 }{}
			waitFor(t, time.Minute, "the key's head to pass the job", func() bool {
				require.NoError(t, b.db.Collection("jobs_keys").FindOne(b.ctx, bson.D{}).Decode(&kd))
				return kd.N == 0
			})
			require.Equal(t, kd.Off+kd.Tail, job.Seq, "the job took the next number")
		})
	}
}

package deferred_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// TestRequeueNeverAppliesTwice: a write made with the job's fence applies
// at most once per job, however often the job is delivered, Requeue
// included. The job's one attempt writes, the write lands and its reply is
// lost; 37 other writes push its write id out of the document's window, so
// the attempt cannot settle it and the job is dead with its outcome
// unknown. Requeue would run it under a new sequence number, past its own
// stamp: it must refuse, typed, and the change stays applied once.
func TestRequeueNeverAppliesTwice(t *testing.T) {
	t.Parallel()
	b := setupFaulty(t, &deferred.Options{MaxAttempts: 1})
	var calls atomic.Int64
	k := registerCredit(t, b.fqueue, b.frepo, &calls)
	b.insert(t, "ana")
	id := enqueue(t, b.ctx, k, "ana", credit{Amount: 1000})
	fault := b.loseFirstWriteAndPushOutItsID(t, "ana")
	run(t, b.fqueue)
	job := wait(t, b.obs, id)
	require.True(t, fault.HasFired())
	require.Equal(t, deferred.StateDead, job.State, "the one attempt's outcome was unknown")
	require.True(t, job.MayHaveApplied)
	b.requireAccount(t, "ana", int64(1000+versioned.WriteIDs+5), int64(1), "the write landed once")

	err := b.obs.Requeue(b.ctx, id)
	require.ErrorIs(t, err, deferred.ErrState)
	var se *deferred.StateError
	require.ErrorAs(t, err, &se)
	require.True(t, se.MayHaveApplied, "%v", err)
	require.Equal(t, deferred.StateDead, se.State)
	require.Contains(t, err.Error(), "may have applied its change")
	job, err = b.obs.Job(b.ctx, id)
	require.NoError(t, err)
	require.Equal(t, deferred.StateDead, job.State, "a refused Requeue changes nothing")

	// Cancel is the way out; the change stays applied once.
	require.NoError(t, b.obs.Cancel(b.ctx, id))
	_, err = b.obs.Job(b.ctx, id)
	require.NoError(t, err)
	b.requireAccount(t, "ana", int64(1000+versioned.WriteIDs+5), int64(1), "the write landed once")
	require.Equal(t, int64(1), calls.Load(), "the handler ran once")
}

// TestRequeueRefusesAPartlyAppliedJob: a handler that changes two
// documents and dies on the second (its guard fails, retry.Permanent) has
// applied the first. Requeue would apply that one again under a new
// sequence number: it refuses, typed. A job that died before it wrote
// anything is requeued and runs.
func TestRequeueRefusesAPartlyAppliedJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	b.insert(t, "ana", "bob")
	var broke atomic.Bool
	broke.Store(true)
	k, err := deferred.Register(q, "move", func(ctx context.Context, job *deferred.Job, c credit) error {
		if c.Index == 0 && broke.Load() {
			return retry.Permanent(errors.New("partner down"))
		}
		if _, err := deferred.Guarded(ctx, job, b.accounts, "ana", nil,
			bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -c.Amount}, {Key: "applied", Value: int64(1)}}}}); err != nil {
			return err
		}
		_, err := deferred.Guarded(ctx, job, b.accounts, "bob", bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: 0}}}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}}})
		if errors.Is(err, versioned.ErrGuardFailed) {
			return retry.Permanent(err)
		}
		return err
	})
	require.NoError(t, err)
	_, err = b.accounts.Collection().UpdateOne(b.ctx, bson.D{{Key: "_id", Value: "bob"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "balance", Value: -1}}}})
	require.NoError(t, err)
	run(t, q)

	partly := enqueue(t, b.ctx, k, "ana", credit{Amount: 5, Index: 1})
	job := wait(t, q, partly)
	require.Equal(t, deferred.StateDead, job.State)
	require.True(t, job.MayHaveApplied, "ana's write landed")
	b.requireAccount(t, "ana", -5, 1)
	err = q.Requeue(b.ctx, partly)
	var se *deferred.StateError
	require.ErrorAs(t, err, &se)
	require.True(t, se.MayHaveApplied)
	b.requireAccount(t, "ana", -5, 1, "ana's change applied once")

	// Nothing written: requeued, and it runs.
	clean := enqueue(t, b.ctx, k, "bob", credit{Amount: 0, Index: 0})
	job = wait(t, q, clean)
	require.Equal(t, deferred.StateDead, job.State)
	require.False(t, job.MayHaveApplied, "the handler failed before any write")
	broke.Store(false)
	_, err = b.accounts.Collection().UpdateOne(b.ctx, bson.D{{Key: "_id", Value: "bob"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "balance", Value: 0}}}})
	require.NoError(t, err)
	require.NoError(t, q.Requeue(b.ctx, clean))
	require.Equal(t, deferred.StateCompleted, wait(t, q, clean).State)
	b.requireAccount(t, "ana", -5, 2)
}

// TestSecondWriteToOneDocumentInAJobIsRefused: the fence lets one write
// per job and document through; a handler's second Guarded (or Modify) of
// the same document would find the first one's stamp and change nothing.
// It is refused, typed (ErrInvalid), never reported as applied: the job is
// dead at once with the reason, and the first change stays applied once.
// Writes to two different documents both apply.
func TestSecondWriteToOneDocumentInAJobIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	b.insert(t, "ana", "bob")
	var second atomic.Value
	k, err := deferred.Register(q, "two", func(ctx context.Context, job *deferred.Job, c credit) error {
		if _, err := deferred.Guarded(ctx, job, b.accounts, "ana", nil,
			bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}}}}); err != nil {
			return err
		}
		if c.Index == 2 { // another document: fine
			_, err := deferred.Guarded(ctx, job, b.accounts, "bob", nil,
				bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}}})
			return err
		}
		_, err := deferred.Modify(ctx, job, b.accounts, "ana", func(a *account) error { a.Applied++; return nil })
		second.Store(fmt.Sprint(err))
		return err
	})
	require.NoError(t, err)
	run(t, q)

	id := enqueue(t, b.ctx, k, "ana", credit{Amount: 7, Index: 1})
	job := wait(t, q, id)
	require.Equal(t, deferred.StateDead, job.State, "refused, not reported as applied")
	require.Equal(t, 1, job.Attempt, "bad input fails every attempt alike: dead at once")
	require.Len(t, job.Errors, 1)
	require.Contains(t, job.Errors[0].Error, "wrote the document")
	msg, _ := second.Load().(string)
	require.True(t, strings.HasPrefix(msg, "deferred: modify: invalid target: "), msg)
	b.requireAccount(t, "ana", 7, 0, "the first change applied once, the second refused")

	id = enqueue(t, b.ctx, k, "ana", credit{Amount: 3, Index: 2})
	require.Equal(t, deferred.StateCompleted, wait(t, q, id).State)
	b.requireAccount(t, "ana", 10, 0)
	b.requireAccount(t, "bob", 3, 1)
}

// TestNumericKeysShareOneFence: the server matches the keys 1, int64(1)
// and 1.0 as one key document and one (key, sequence) place, so their jobs
// share one sequence; they must share one fence field too, or a late copy
// of an earlier job's write would pass the fence of another field and apply
// after a later job's. The target document carries one stamp.
func TestNumericKeysShareOneFence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	b.insert(t, "n")
	var fields sync.Map
	k, err := deferred.Register(q, "inc", func(ctx context.Context, job *deferred.Job, c credit) error {
		fields.Store(job.FenceField(), true)
		_, err := deferred.Guarded(ctx, job, b.accounts, "n", nil,
			bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}}})
		return err
	})
	require.NoError(t, err)
	keys := []any{int32(1), int64(1), 1.0, int32(1)}
	ids := make([]bson.ObjectID, 0, len(keys))
	for i, key := range keys {
		ids = append(ids, enqueue(t, b.ctx, k, key, credit{Amount: 1, Index: int64(i + 1)}))
	}
	run(t, q)
	for _, id := range ids {
		require.Equal(t, deferred.StateCompleted, wait(t, q, id).State)
	}
	b.requireAccount(t, "n", 4, 4)
	n := 0
	fields.Range(func(any, any) bool { n++; return true })
	require.Equal(t, 1, n, "one fence field for the key")
	var raw bson.Raw
	require.NoError(t, b.accounts.Collection().FindOne(b.ctx, bson.D{{Key: "_id", Value: "n"}}).Decode(&raw))
	stamps, err := raw.Lookup(deferred.DefaultFenceField).Document().Elements()
	require.NoError(t, err)
	require.Len(t, stamps, 1, "one stamp on the document: %v", raw)
}

// TestErrorsAreBounded: a job keeps the newest MaxErrors failed attempts,
// however often it is requeued: its document stays small.
func TestErrorsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const attempts = 7
	q := b.queue(t, nil, &deferred.Options{MaxAttempts: attempts})
	var n atomic.Int64
	k, err := deferred.Register(q, "fail", func(context.Context, *deferred.Job, int) error {
		return fmt.Errorf("failure %d", n.Add(1))
	})
	require.NoError(t, err)
	run(t, q)
	id := enqueue(t, b.ctx, k, "x", 1)
	rounds := deferred.MaxErrors/attempts + 2
	for round := 1; ; round++ {
		job := wait(t, q, id)
		require.Equal(t, deferred.StateDead, job.State)
		require.LessOrEqual(t, len(job.Errors), deferred.MaxErrors)
		require.Len(t, job.Errors, min(round*attempts, deferred.MaxErrors))
		last := job.Errors[len(job.Errors)-1]
		require.Equal(t, fmt.Sprintf("failure %d", n.Load()), last.Error, "the newest is kept")
		if round == rounds {
			break
		}
		require.NoError(t, q.Requeue(b.ctx, id))
	}
	require.Greater(t, n.Load(), int64(deferred.MaxErrors), "more failures than are kept")
}

// TestIdleKeysAreDeleted: the keys collection holds a document per key
// only while the key has work or was worked within Retention; Run's sweep
// deletes the others, on every server (TTL indexes or not). A key used
// again afterwards starts a new document whose numbers are above the old
// ones, so its jobs pass the fence of the stamps the old ones left.
func TestIdleKeysAreDeleted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, &deferred.Options{Retention: time.Second})
	b.insert(t, "ana", "bob", "eve")
	k := registerCredit(t, q, b.accounts, new(atomic.Int64))
	ids := make([]bson.ObjectID, 0, 3)
	for _, id := range []string{"ana", "bob", "eve"} {
		ids = append(ids, enqueue(t, b.ctx, k, id, credit{Amount: 1}))
	}
	run(t, q)
	for _, id := range ids {
		require.Equal(t, deferred.StateCompleted, wait(t, q, id).State)
	}
	var first bson.M
	require.NoError(t, q.Keys().FindOne(b.ctx, bson.D{{Key: "_id", Value: "ana"}}).Decode(&first))
	waitFor(t, time.Minute, "the idle keys' documents to be deleted", func() bool {
		n, err := q.Keys().CountDocuments(b.ctx, bson.D{})
		require.NoError(t, err)
		return n == 0
	})
	again := enqueue(t, b.ctx, k, "ana", credit{Amount: 10})
	job := wait(t, q, again)
	require.Equal(t, deferred.StateCompleted, job.State)
	off, _ := first["off"].(int64)
	tail, _ := first["tail"].(int64)
	require.Positive(t, off)
	require.Greater(t, job.Seq, off+tail, "numbered above the old key's")
	b.requireAccount(t, "ana", 11, 2, "the new job passed the old stamp's fence")
}

// TestStampsPerDocumentAreBounded: a target document carries one stamp per
// key whose jobs wrote it; Options.MaxStamps bounds them. A fenced write
// that would add one more is refused, typed (ErrInvalid), and its job is
// dead at once; jobs of keys whose stamp is there already go on writing.
// The bound needs $expr in a write's filter: proven where the server has
// it (DocumentDB, MongoDB).
func TestStampsPerDocumentAreBounded(t *testing.T) {
	t.Parallel()
	mongotest.Use(t, mongotest.Expr)
	b := setup(t)
	q := b.queue(t, nil, &deferred.Options{MaxStamps: 3})
	b.insert(t, "shared")
	k, err := deferred.Register(q, "add", func(ctx context.Context, job *deferred.Job, c credit) error {
		if c.Index == 0 {
			_, err := deferred.Modify(ctx, job, b.accounts, "shared", func(a *account) error { a.Balance += c.Amount; return nil })
			return err
		}
		_, err := deferred.Guarded(ctx, job, b.accounts, "shared", nil,
			bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}}})
		return err
	})
	require.NoError(t, err)
	run(t, q)
	for _, key := range []string{"a", "b", "c"} {
		require.Equal(t, deferred.StateCompleted, wait(t, q, enqueue(t, b.ctx, k, key, credit{Amount: 1, Index: 1})).State)
	}
	for i, key := range []string{"d", "e"} {
		job := wait(t, q, enqueue(t, b.ctx, k, key, credit{Amount: 100, Index: int64(i)})) // Modify, then Guarded
		require.Equal(t, deferred.StateDead, job.State, "a fourth key's stamp is refused")
		require.Equal(t, 1, job.Attempt, "dead at once")
		require.Contains(t, job.Errors[0].Error, "MaxStamps")
	}
	require.Equal(t, deferred.StateCompleted, wait(t, q, enqueue(t, b.ctx, k, "b", credit{Amount: 10, Index: 1})).State, "a key with a stamp writes on")
	b.requireAccount(t, "shared", 13, 4)
	var raw bson.Raw
	require.NoError(t, b.accounts.Collection().FindOne(b.ctx, bson.D{{Key: "_id", Value: "shared"}}).Decode(&raw))
	stamps, err := raw.Lookup(deferred.DefaultFenceField).Document().Elements()
	require.NoError(t, err)
	require.Len(t, stamps, 3)
}

// TestTakenOverJobMayHaveApplied: worker A's handler writes, then A is cut
// off past its claim, so it never records the attempt. B takes the job
// over and its attempt dies before writing (a handler that gives up at
// once). The job is dead, and A's write landed: it must say it may have
// applied its change, and Requeue must refuse it.
func TestTakenOverJobMayHaveApplied(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	b := setupFaulty(t, &deferred.Options{VisibilityTimeout: ttl, Owner: "A"})
	qb := b.queue(t, nil, &deferred.Options{VisibilityTimeout: ttl, Owner: "B"})
	b.insert(t, "ana")
	applied := make(chan struct{})
	var once sync.Once
	_, err := deferred.Register(b.fqueue, "credit", func(ctx context.Context, job *deferred.Job, c credit) error {
		if _, err := deferred.Guarded(ctx, job, b.frepo, "ana", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}}}); err != nil {
			return err
		}
		once.Do(func() {
			b.f.Pause(2 * ttl) // A is cut off from the server from now on
			close(applied)
		})
		<-ctx.Done()
		return nil
	})
	require.NoError(t, err)
	kb, err := deferred.Register(qb, "credit", func(context.Context, *deferred.Job, credit) error {
		return retry.Permanent(errors.New("given up before writing"))
	})
	require.NoError(t, err)
	id := enqueue(t, b.ctx, kb, "ana", credit{Amount: 5})
	run(t, b.fqueue)
	<-applied
	run(t, qb)
	job := wait(t, qb, id)
	require.Equal(t, deferred.StateDead, job.State)
	require.Equal(t, "B", job.Owner, "B took the job over")
	require.True(t, job.MayHaveApplied, "A's attempt wrote before it was lost")
	err = qb.Requeue(b.ctx, id)
	var se *deferred.StateError
	require.ErrorAs(t, err, &se)
	require.True(t, se.MayHaveApplied)
	b.requireAccount(t, "ana", 5, 1)
}

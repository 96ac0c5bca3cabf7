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
	"github.com/mongocas/mongocas/versioned"
)

// faultyBundle is a bundle whose queue and account repository go through a
// fault proxy, and a second, clean, repository of the same accounts.
type faultyBundle struct {
	*bundle
	f      *mongotest.Faulty
	frepo  *versioned.Repo[account]
	fqueue *deferred.Queue
	// obs is a queue over the same jobs on the clean client: the test
	// looks at jobs, waits for them and requeues or cancels them through
	// it, so that a connection the proxy closes for a fault (the faulty
	// client does not retry reads) cannot fail the looking.
	obs *deferred.Queue
}

func setupFaulty(t testing.TB, opts *deferred.Options) *faultyBundle {
	t.Helper()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	frepo, err := versioned.New[account](f.Collection("accounts"), nil)
	require.NoError(t, err)
	return &faultyBundle{bundle: b, f: f, frepo: frepo, fqueue: b.queue(t, f.Database, opts), obs: b.queue(t, nil, opts)}
}

// registerCredit registers "credit" on q, applying through repo with
// Guarded; calls counts the handler's calls.
func registerCredit(t testing.TB, q *deferred.Queue, repo *versioned.Repo[account], calls *atomic.Int64) *deferred.Kind[credit] {
	t.Helper()
	k, err := deferred.Register(q, "credit", func(ctx context.Context, job *deferred.Job, c credit) error {
		calls.Add(1)
		var id string
		if err := job.Key.Unmarshal(&id); err != nil {
			return err
		}
		_, err := deferred.Guarded(ctx, job, repo, id, nil,
			bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}}})
		return err
	})
	require.NoError(t, err)
	return k
}

// setupCredit is setupFaulty with "credit" registered on its queue
// (applied through its repository; calls counts the handler's calls) and
// the account "ana".
func setupCredit(t testing.TB) (b *faultyBundle, k *deferred.Kind[credit], calls *atomic.Int64) {
	t.Helper()
	b = setupFaulty(t, nil)
	calls = new(atomic.Int64)
	k = registerCredit(t, b.fqueue, b.frepo, calls)
	b.insert(t, "ana")
	return b, k, calls
}

// TestAckLostAfterWrite: the handler's write lands and the worker never
// learns it (the server's reply is replaced by an error that says nothing
// was written, so versioned does not re-read: the worker believes it
// failed). The attempt fails; the next attempt finds the job's stamp on the
// document and completes without applying it again.
func TestAckLostAfterWrite(t *testing.T) {
	t.Parallel()
	b, k, calls := setupCredit(t)
	id := enqueue(t, b.ctx, k, "ana", credit{Amount: 7})
	fault := b.f.ErrorAfterApply(mongotest.Writes("accounts"), mongotest.ServerError{Code: 2, CodeName: "BadValue"})
	run(t, b.fqueue)
	job := wait(t, b.obs, id)
	require.True(t, fault.HasFired())
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 2, job.Attempt, "the first attempt failed on the lost acknowledgment")
	require.Len(t, job.Errors, 1)
	require.Equal(t, int64(2), calls.Load())
	b.requireAccount(t, "ana", int64(7), int64(1), "applied once")
}

// TestDiesAfterWrite: the handler writes and then dies (panics) before it
// can report: the worker records the attempt as failed, lives on, and the
// next attempt finds the stamp.
func TestDiesAfterWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	b.insert(t, "ana")
	var calls atomic.Int64
	k, err := deferred.Register(q, "credit", func(ctx context.Context, job *deferred.Job, c credit) error {
		_, err := deferred.Guarded(ctx, job, b.accounts, "ana", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}}})
		if calls.Add(1) == 1 {
			panic("killed after the write")
		}
		return err
	})
	require.NoError(t, err)
	id := enqueue(t, b.ctx, k, "ana", credit{Amount: 7})
	run(t, q)
	job := wait(t, q, id)
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 2, job.Attempt)
	require.True(t, job.Errors[0].Panic)
	require.Contains(t, job.Errors[0].Error, "killed after the write")
	b.requireAccount(t, "ana", int64(7), int64(1))
}

// TestStampOutlivesWriteIDs: the handler's write lands, its reply is lost,
// and meanwhile 37 other writes move the document on, more than the
// versioned.WriteIDs (16) write ids a document keeps: versioned cannot tell whether the write landed (an
// unknown outcome). The next attempt can: the job's stamp is one number per
// key, and it is on the document.
func TestStampOutlivesWriteIDs(t *testing.T) {
	t.Parallel()
	b, k, _ := setupCredit(t)
	id := enqueue(t, b.ctx, k, "ana", credit{Amount: 1000})
	fault := b.loseFirstWriteAndPushOutItsID(t, "ana")
	run(t, b.fqueue)
	job := wait(t, b.obs, id)
	require.True(t, fault.HasFired())
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 2, job.Attempt)
	require.Contains(t, job.Errors[0].Error, "unknown", "versioned could not settle it")
	b.requireAccount(t, "ana", int64(1000+versioned.WriteIDs+5), int64(1), "the credit applied once")
}

// loseFirstWriteAndPushOutItsID drops the reply of the next write to the
// accounts through the faulty client, after making WriteIDs+5 other writes
// to the account id land meanwhile: the write's id is gone from the
// document's window, so versioned cannot settle it (an unknown outcome).
func (b *faultyBundle) loseFirstWriteAndPushOutItsID(t *testing.T, id string) *mongotest.Fault {
	t.Helper()
	var once sync.Once
	writes := mongotest.Writes("accounts")
	return b.f.DropNextReply(func(c *mongotest.Command) bool {
		if !writes(c) {
			return false
		}
		once.Do(func() {
			for range versioned.WriteIDs + 5 {
				_, err := b.accounts.Modify(b.ctx, id, func(a *account) error { a.Balance++; return nil })
				require.NoError(t, err)
			}
		})
		return true
	})
}

// TestCompletionReplyLost: the write that records the job completed lands
// and its reply is lost; the worker re-reads, sees it, and moves on: the job
// runs once.
func TestCompletionReplyLost(t *testing.T) {
	t.Parallel()
	b, k, calls := setupCredit(t)
	id1 := enqueue(t, b.ctx, k, "ana", credit{Amount: 1})
	id2 := enqueue(t, b.ctx, k, "ana", credit{Amount: 2})
	jobs := mongotest.Commands([]string{"update"}, "jobs")
	keys := mongotest.Commands([]string{"findAndModify"}, "jobs_keys")
	f1 := b.f.DropNextReply(jobs)
	f2 := b.f.DropNextReply(keys)
	run(t, b.fqueue)
	for _, id := range []bson.ObjectID{id1, id2} {
		job := wait(t, b.obs, id)
		require.Equal(t, deferred.StateCompleted, job.State)
		require.Equal(t, 1, job.Attempt)
	}
	require.True(t, f1.HasFired())
	require.True(t, f2.HasFired())
	require.Equal(t, int64(2), calls.Load())
	require.Equal(t, int64(3), b.get(t, "ana").Balance)
}

// TestWorkerPausedPastItsClaim: worker A writes the change and then stops
// hearing from the server (its traffic is held) for longer than the
// visibility timeout, before it can record the job done. Its claim lapses,
// its handler's context ends, and worker B takes the job over: the stamp
// says it is applied, so B completes it and runs the next job. When A's
// traffic flows again, its late writes change nothing.
func TestWorkerPausedPastItsClaim(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	b, qb := setupAB(t, ttl)

	var bCalls atomic.Int64
	applied, aCalls := creditThenCutOff(t, b, 2*ttl) // A is cut off for two TTLs
	kb := registerCredit(t, qb, b.accounts, &bCalls)

	id1 := enqueue(t, b.ctx, kb, "ana", credit{Amount: 5})
	id2 := enqueue(t, b.ctx, kb, "ana", credit{Amount: 100})
	run(t, b.fqueue)
	<-applied
	run(t, qb)
	job1 := wait(t, qb, id1)
	job2 := wait(t, qb, id2)
	require.Equal(t, deferred.StateCompleted, job1.State)
	require.Equal(t, "B", job1.Owner, "B took the job over")
	require.Equal(t, 2, job1.Attempt)
	require.Equal(t, deferred.StateCompleted, job2.State)
	require.Equal(t, int64(1), aCalls.Load())
	require.Equal(t, int64(2), bCalls.Load(), "B ran job 1 again (it found it applied) and job 2")
	time.Sleep(2 * ttl) // A's traffic flows again: whatever it sends now is fenced off
	b.requireAccount(t, "ana", int64(105), int64(2))
	job1, err := qb.Job(b.ctx, id1)
	require.NoError(t, err)
	require.Equal(t, "B", job1.Owner)
	require.Equal(t, deferred.StateCompleted, job1.State)
}

// TestLateCopyOfTheWrite: the handler's write is held at the proxy (the
// worker gets a network error; versioned re-reads and sends it again,
// which lands); the held copy is delivered afterwards, when the job is
// done, and matches nothing.
func TestLateCopyOfTheWrite(t *testing.T) {
	t.Parallel()
	b, k, _ := setupCredit(t)
	fault := b.f.HoldNext(mongotest.Writes("accounts"))
	id := enqueue(t, b.ctx, k, "ana", credit{Amount: 9})
	run(t, b.fqueue)
	job := wait(t, b.obs, id)
	require.Equal(t, deferred.StateCompleted, job.State)
	require.True(t, fault.HasFired())
	reply, err := fault.Deliver(b.ctx)
	require.NoError(t, err)
	n, _ := reply.Lookup("n").AsInt64OK()
	require.Zero(t, n, "the late copy matched nothing: %v", reply)
	b.requireAccount(t, "ana", int64(9), int64(1))
}

// TestOwnConditionalWrite: a handler that writes with the driver directly,
// adding Job.Fence to its filter and Job.Stamp to its $set, applies once
// across a lost acknowledgment too.
func TestOwnConditionalWrite(t *testing.T) {
	t.Parallel()
	b := setupFaulty(t, nil)
	coll := b.f.Collection("counters")
	_, err := b.db.Collection("counters").InsertOne(b.ctx, bson.D{{Key: "_id", Value: "c"}, {Key: "n", Value: 0}})
	require.NoError(t, err)
	k, err := deferred.Register(b.fqueue, "bump", func(ctx context.Context, job *deferred.Job, by int) error {
		filter := append(bson.D{{Key: "_id", Value: "c"}}, job.Fence()...)
		_, err := coll.UpdateOne(ctx, filter, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: by}}}, {Key: "$set", Value: bson.D{job.Stamp()}}})
		return err // MatchedCount 0: applied before
	})
	require.NoError(t, err)
	fault := b.f.ErrorAfterApply(mongotest.Writes("counters"), mongotest.NotWritablePrimary())
	ids := make([]bson.ObjectID, 0, 3)
	for range 3 {
		id := enqueue(t, b.ctx, k, "c", 2)
		ids = append(ids, id)
	}
	run(t, b.fqueue)
	for _, id := range ids {
		require.Equal(t, deferred.StateCompleted, wait(t, b.obs, id).State)
	}
	require.True(t, fault.HasFired())
	var doc bson.M
	require.NoError(t, b.db.Collection("counters").FindOne(b.ctx, bson.D{{Key: "_id", Value: "c"}}).Decode(&doc))
	require.EqualValues(t, 6, doc["n"])
}

// setupAB returns worker A (b's faulty queue) and worker B (qb, on the
// test's own client), both with claims of ttl, and the account "ana".
func setupAB(t *testing.T, ttl time.Duration) (b *faultyBundle, qb *deferred.Queue) {
	t.Helper()
	b = setupFaulty(t, &deferred.Options{VisibilityTimeout: ttl, Owner: "A"})
	qb = b.queue(t, nil, &deferred.Options{VisibilityTimeout: ttl, Owner: "B"})
	b.insert(t, "ana")
	return b, qb
}

// creditThenCutOff registers on b's faulty queue (worker A) a credit handler
// that applies its change to "ana", then cuts A off from the server for
// pause (once, closing applied) and waits for its claim to lapse. It
// returns applied and the count of A's handler calls.
func creditThenCutOff(t *testing.T, b *faultyBundle, pause time.Duration) (applied <-chan struct{}, calls *atomic.Int64) {
	t.Helper()
	calls = &atomic.Int64{}
	done := make(chan struct{})
	var once sync.Once
	_, err := deferred.Register(b.fqueue, "credit", func(ctx context.Context, job *deferred.Job, c credit) error {
		calls.Add(1)
		_, err := deferred.Guarded(ctx, job, b.frepo, "ana", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}}})
		if err != nil {
			return err
		}
		once.Do(func() {
			b.f.Pause(pause)
			close(done)
		})
		<-ctx.Done() // the claim lapses while A cannot renew it
		return nil
	})
	require.NoError(t, err)
	return done, calls
}

// TestWorkerCutOffForGoodIsTakenOver: as TestWorkerPausedPastItsClaim, but
// A never hears from the server again (a partition, or a process killed
// mid-job) and its Run is stopped: B, already running, takes the job over
// once A's claim lapses, and completes it and the next job.
func TestWorkerCutOffForGoodIsTakenOver(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	b, qb := setupAB(t, ttl)

	var bCalls atomic.Int64
	applied, aCalls := creditThenCutOff(t, b, time.Hour) // A is cut off for good
	kb := registerCredit(t, qb, b.accounts, &bCalls)

	id1 := enqueue(t, b.ctx, kb, "ana", credit{Amount: 5})
	stopA := run(t, b.fqueue)
	<-applied
	run(t, qb) // B runs while A still holds the key
	began := time.Now()
	stopA() // A's process ends
	stopped := time.Since(began)
	job1 := wait(t, qb, id1)
	t.Logf("A's Run returned %v after its stop; B completed the job %v after it", stopped, time.Since(began))
	id2 := enqueue(t, b.ctx, kb, "ana", credit{Amount: 100})
	job2 := wait(t, qb, id2)
	require.Equal(t, deferred.StateCompleted, job1.State)
	require.Equal(t, "B", job1.Owner, "B took the job over")
	require.Equal(t, deferred.StateCompleted, job2.State)
	require.Equal(t, int64(1), aCalls.Load())
	b.requireAccount(t, "ana", int64(105), int64(2))
}

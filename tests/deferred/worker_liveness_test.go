package deferred_test

import (
	"context"
	"log/slog"
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

// TestCancelledHeadFreesItsKey: Cancel's doc says a cancelled
// job is taken "out of the queue for good: it is marked cancelled, its key
// moves on without it". A head job that snoozed (or failed with a backoff)
// left the key document's "due" at its runAt; Cancel does not touch the
// key, and the workers' search skips keys whose due has not passed, so the
// jobs behind the cancelled one wait for the cancelled job's runAt (here an
// hour).
func TestCancelledHeadFreesItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	var ran atomic.Int64
	k, err := deferred.Register(q, "s", func(_ context.Context, _ *deferred.Job, i int) error {
		if i == 1 {
			return deferred.Snooze(time.Hour)
		}
		ran.Add(1)
		return nil
	})
	require.NoError(t, err)
	first := enqueue(t, b.ctx, k, "x", 1)
	run(t, q)
	waitFor(t, time.Minute, "the first job to snooze", func() bool {
		j, err := q.Job(b.ctx, first)
		return err == nil && j.State == deferred.StateAvailable && !j.RunAt.IsZero()
	})
	require.NoError(t, q.Cancel(b.ctx, first))
	second := enqueue(t, b.ctx, k, "x", 2)
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	job, err := q.Wait(ctx, second, 50*time.Millisecond)
	var kd bson.M
	_ = q.Keys().FindOne(b.ctx, bson.D{}).Decode(&kd)
	t.Logf("key document: %v", kd)
	require.NoError(t, err, "the job behind the cancelled head did not run within 15s (state %v)", job)
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, int64(1), ran.Load())
	cancelled, err := q.Job(b.ctx, first)
	require.NoError(t, err)
	require.Equal(t, deferred.StateCancelled, cancelled.State)
}

// TestMissingHandlerDoesNotSpin: a Run without the handler of a key's head
// job (a rolling deploy that adds a handler) used to claim the key, put the
// job back, release the key, and, since it did claim, claim it again after
// PollInterval/10, forever. Count the requests of such a Run over 3 s
// against an idle one; it must say once why it leaves the key alone, and a
// Run that has the handler must then run the job at once.
func TestMissingHandlerDoesNotSpin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	opts := &deferred.Options{PollInterval: time.Second}
	q := b.queue(t, nil, opts)
	kb, err := deferred.Register(q, "b", func(context.Context, *deferred.Job, int) error { return nil })
	require.NoError(t, err)
	logs := &warnings{}
	fq := b.queue(t, f.Database, &deferred.Options{PollInterval: time.Second, Observer: observe.Slog(slog.New(logs))})
	_, err = deferred.Register(fq, "a", func(context.Context, *deferred.Job, int) error { return nil })
	require.NoError(t, err)
	run(t, fq)
	time.Sleep(2 * time.Second)
	idle0 := f.Requests()
	time.Sleep(3 * time.Second)
	idle := f.Requests() - idle0
	id := enqueue(t, b.ctx, kb, "x", 1)
	// The Run without the handler claims the key once (about a dozen
	// requests, its first claim probing the server too) and says why it
	// leaves it; count what it does afterwards.
	waitFor(t, time.Minute, "the Run without the handler to skip the key", func() bool {
		return len(logs.with("queue.key_skipped")) > 0
	})
	time.Sleep(500 * time.Millisecond)
	busy0 := f.Requests()
	time.Sleep(3 * time.Second)
	busy := f.Requests() - busy0
	job, err := q.Job(b.ctx, id)
	require.NoError(t, err)
	t.Logf("requests in 3s: idle %d, with one job it has no handler for %d; job state %s, attempt %d", idle, busy, job.State, job.Attempt)
	require.Less(t, busy, 3*idle+10, "a Run with no handler for a job spins on its key")
	require.Equal(t, deferred.StateAvailable, job.State)
	require.Zero(t, job.Attempt, "the Run without the handler counted an attempt")
	skips := logs.with("queue.key_skipped")
	require.Len(t, skips, 1, "one warning for the one key skipped")
	require.Equal(t, "b", skips[0]["name"])
	require.Equal(t, "no_handler", skips[0]["reason"])
	require.Equal(t, `"x"`, skips[0]["key"])

	start := time.Now()
	run(t, q)
	job = wait(t, q, id)
	t.Logf("the Run with the handler completed the job in %v", time.Since(start))
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 1, job.Attempt)
}

// TestCancelledHeadWithoutHandlerFreesItsKey: a Run without the handler of
// a key's head job leaves the key to the processes that have it; once that
// head is cancelled, the Run must work the key's next job, whose handler it
// has.
func TestCancelledHeadWithoutHandlerFreesItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	kb, err := deferred.Register(q, "b", func(context.Context, *deferred.Job, int) error { return nil })
	require.NoError(t, err)
	ka, err := deferred.Register(q, "a", func(context.Context, *deferred.Job, int) error { return nil })
	require.NoError(t, err)
	logs := &warnings{}
	qa := b.queue(t, nil, &deferred.Options{Observer: observe.Slog(slog.New(logs))})
	var ran atomic.Int64
	_, err = deferred.Register(qa, "a", func(context.Context, *deferred.Job, int) error { ran.Add(1); return nil })
	require.NoError(t, err)
	head := enqueue(t, b.ctx, kb, "x", 1)
	next := enqueue(t, b.ctx, ka, "x", 2)
	run(t, qa)
	waitFor(t, time.Minute, "the Run without the head's handler to skip the key", func() bool {
		return len(logs.with("queue.key_skipped")) > 0
	})
	require.NoError(t, q.Cancel(b.ctx, head))
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	job, err := qa.Wait(ctx, next, 20*time.Millisecond)
	require.NoError(t, err, "the job behind the cancelled head did not run within 15s (state %v)", job)
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, int64(1), ran.Load())
}

// warnings is a slog.Handler that keeps the attributes of the records it
// handles, by message.
type warnings struct {
	mu      sync.Mutex
	records []slog.Record
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.records = append(w.records, r.Clone())
	return nil
}

func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }

func (w *warnings) WithGroup(string) slog.Handler { return w }

// with returns the attributes of the records whose message contains msg.
func (w *warnings) with(msg string) []map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []map[string]string
	for _, r := range w.records {
		if !strings.Contains(r.Message, msg) {
			continue
		}
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		out = append(out, attrs)
	}
	return out
}

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

	claims := mongotest.Commands([]string{"update"}, b.jobs.Name()) // a job's claim is its first update
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

// TestTransientRenewalFailuresKeepTheKey: three renewals of a worker's
// claim in a row fail with a retryable server error (a primary shutting
// down) while its handler runs longer than the visibility timeout. The
// worker retries them soon instead of waiting a third of the timeout each,
// so the claim holds: the handler's context is not cancelled, and the job
// completes with one attempt. (Each shutdown error also makes the driver
// forget the server until its next heartbeat, about 500 ms: hence a
// visibility timeout of 6 s, whose claim lapses 5.4 s after the last
// renewal, two failed renewals later when they are not retried.)
func TestTransientRenewalFailuresKeepTheKey(t *testing.T) {
	t.Parallel()
	const ttl = 6 * time.Second
	b := setup(t)
	f := b.db.Faulty(t, nil)
	q := b.queue(t, f.Database, &deferred.Options{VisibilityTimeout: ttl})
	var calls atomic.Int64
	var cancelled atomic.Bool
	started := make(chan struct{})
	k, err := deferred.Register(q, "long", func(ctx context.Context, _ *deferred.Job, _ int) error {
		if calls.Add(1) == 1 {
			close(started)
		}
		select {
		case <-time.After(ttl + ttl/3):
			return nil
		case <-ctx.Done():
			cancelled.Store(true)
			return context.Cause(ctx)
		}
	})
	require.NoError(t, err)
	id := enqueue(t, b.ctx, k, "x", 1)
	run(t, q)
	select {
	case <-started:
	case <-time.After(time.Minute):
		t.Fatal("the handler was not called within a minute")
	}
	// From now on, only renewals write the keys collection (the first one
	// ttl/3 after the claim).
	renewals := mongotest.Commands([]string{"findAndModify", "update"}, b.jobs.Name()+"_keys")
	// What a server shutting down answers a write: labelled retryable.
	shutdown := func(code int32, name string) mongotest.ServerError {
		return mongotest.ServerError{Code: code, CodeName: name, ErrorLabels: []string{"RetryableWriteError"}}
	}
	faults := []*mongotest.Fault{
		f.ErrorBeforeApply(renewals, shutdown(91, "ShutdownInProgress")),
		f.ErrorBeforeApply(renewals, shutdown(11600, "InterruptedAtShutdown")),
		f.ErrorBeforeApply(renewals, shutdown(91, "ShutdownInProgress")),
	}
	job := wait(t, q, id)
	for i, fault := range faults {
		require.True(t, fault.HasFired(), "renewal fault %d did not fire", i)
	}
	require.False(t, cancelled.Load(), "the handler's context ended: the claim was lost")
	require.Empty(t, job.Errors)
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 1, job.Attempt, "the claim was lost and the job taken over")
	require.Equal(t, int64(1), calls.Load())
}

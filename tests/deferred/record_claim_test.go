package deferred_test

import (
	"context"
	"slices"
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

// recordAndClaim matches the command of a handler's run that records a job
// and claims the next one: an update of the jobs collection with two
// statements, one that completes a job and one that claims a job.
func recordAndClaim(c *mongotest.Command) bool {
	if c.Name != "update" || c.Collection != "jobs" {
		return false
	}
	st := statements(c)
	return len(st) == 2 && setsState(st[0], deferred.StateCompleted) && claims(st[1])
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

// creditsThrough enqueues three credits of "ana" (1, 2 and 4), arms a fault
// on the worker's traffic with arm, runs the worker, and requires what check
// requires; it returns the bundle, the fault (fired) and check: each job
// completed in its first attempt (a claim sent again counts none), the
// handler called once per job, and the balance their sum.
func creditsThrough(t *testing.T, arm func(*mongotest.Faulty) *mongotest.Fault) (*faultyBundle, *mongotest.Fault, func()) {
	t.Helper()
	b, k, calls := setupCredit(t)
	ids, sum := creditJobs(t, b, k, 3)
	fault := arm(b.f)
	run(t, b.fqueue)
	check := func() {
		t.Helper()
		for _, id := range ids {
			job := wait(t, b.obs, id)
			require.Equal(t, deferred.StateCompleted, job.State)
			require.Equal(t, 1, job.Attempt)
		}
		require.Equal(t, int64(len(ids)), calls.Load())
		require.Equal(t, sum, b.get(t, "ana").Balance)
	}
	check()
	require.True(t, fault.HasFired())
	return b, fault, check
}

// TestRecordAndNextClaimReplyLost: the command that records a handler's job
// and claims the next one lands and its reply is lost. The worker reads the
// two jobs back and goes on: every job runs once, in one attempt.
func TestRecordAndNextClaimReplyLost(t *testing.T) {
	t.Parallel()
	creditsThrough(t, func(f *mongotest.Faulty) *mongotest.Fault { return f.DropNextReply(recordAndClaim) })
}

// TestRecordAndNextClaimLateCopy: the command that records a job and claims
// the next one is held in the network (not applied) and the worker hears a
// network error. It sends the record and the claim again; when the held copy
// reaches the server afterwards, neither of its statements matches.
func TestRecordAndNextClaimLateCopy(t *testing.T) {
	t.Parallel()
	b, held, check := creditsThrough(t, func(f *mongotest.Faulty) *mongotest.Fault { return f.HoldNext(recordAndClaim) })
	reply, err := held.Deliver(b.ctx)
	require.NoError(t, err)
	n, ok := reply.Lookup("n").AsInt64OK()
	require.True(t, ok, "reply %v", reply)
	require.Zero(t, n, "the late copy applied: %v", reply)
	check()
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
			require.NoError(t, b.obs.Cancel(ctx, second))
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
	require.Equal(t, deferred.StateCompleted, wait(t, b.obs, ids[0]).State)
	require.Equal(t, deferred.StateCancelled, wait(t, b.obs, ids[1]).State)
	job := wait(t, b.obs, ids[2])
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 1, job.Attempt)
	require.Equal(t, int64(2), calls.Load())
	require.Equal(t, int64(1+4), b.get(t, "ana").Balance)
	require.Positive(t, combined.Load(), "the record of the first job carried the claim of the second")
}

// TestNextJobRunsWhenTheRecordCannotBeSettled: the command that records job
// 0 and claims job 1 lands, its reply is lost, and the re-read that would
// settle it fails, so job 0 is left running for the key's next holder. Job
// 1, claimed by that command and never started, is given back: it runs once,
// in its first attempt, even with MaxAttempts 1.
func TestNextJobRunsWhenTheRecordCannotBeSettled(t *testing.T) {
	t.Parallel()
	b := setupFaulty(t, &deferred.Options{MaxAttempts: 1})
	plain := b.queue(t, nil, nil)
	var calls [2]atomic.Int64
	k, err := deferred.Register(b.fqueue, "j", func(_ context.Context, _ *deferred.Job, i int) error {
		calls[i].Add(1)
		return nil
	})
	require.NoError(t, err)
	ids := []bson.ObjectID{enqueue(t, b.ctx, k, "x", 0), enqueue(t, b.ctx, k, "x", 1)}
	var dropped atomic.Bool
	lost := b.f.DropNextReply(func(c *mongotest.Command) bool {
		if recordAndClaim(c) {
			dropped.Store(true)
			return true
		}
		return false
	})
	readFails := b.f.ErrorBeforeApply(func(c *mongotest.Command) bool {
		return dropped.Load() && c.Name == "find" && c.Collection == "jobs"
	}, mongotest.ServerError{Code: 2, CodeName: "BadValue"})
	run(t, b.fqueue)
	j0, j1 := wait(t, plain, ids[0]), wait(t, plain, ids[1])
	require.True(t, lost.HasFired())
	require.True(t, readFails.HasFired())
	t.Logf("job 0: %s attempt %d; job 1: %s attempt %d mw %v errors %+v; calls %d %d",
		j0.State, j0.Attempt, j1.State, j1.Attempt, j1.MayHaveApplied, j1.Errors, calls[0].Load(), calls[1].Load())
	require.Equal(t, deferred.StateCompleted, j1.State)
	require.Equal(t, 1, j1.Attempt)
	require.Equal(t, int64(1), calls[1].Load())
}

// TestNeverStartedJobGoesBackWhenTheKeyIsLost: the command that records job
// 0 and claims job 1 applies, and its reply (with every reply after it) comes
// back later than the worker's claim on the key lasts, within
// ResolveTimeout. The worker, which learns it lost the key before job 1
// starts, gives job 1 back: uncharged, not marked as possibly applied, it
// runs in its first attempt on the next worker, even with MaxAttempts 1.
func TestNeverStartedJobGoesBackWhenTheKeyIsLost(t *testing.T) {
	t.Parallel()
	requireGivenBackAfterLateReplies(t, 2*time.Second, 2*2*time.Second, 3*2*time.Second)
}

// TestNeverStartedJobGoesBackWhenTheRecordFailsAndTheKeyIsLost: the same,
// with replies later than ResolveTimeout too: the record of job 0 cannot be
// settled (job 0 stays running for the next worker), and job 1 goes back
// all the same.
func TestNeverStartedJobGoesBackWhenTheRecordFailsAndTheKeyIsLost(t *testing.T) {
	t.Parallel()
	requireGivenBackAfterLateReplies(t, 2*time.Second, 6*2*time.Second, 3*time.Second)
}

// requireGivenBackAfterLateReplies runs two jobs of one key on worker A
// (claims lasting ttl), whose replies from the command that records job 0
// and claims job 1 on come back late by delay; it requires job 1 given back
// by A, then run once, in its first attempt, by worker B.
func requireGivenBackAfterLateReplies(t *testing.T, ttl, delay, resolve time.Duration) {
	t.Helper()
	var lost runErrors
	b := setupFaulty(t, &deferred.Options{VisibilityTimeout: ttl, Owner: "A", MaxAttempts: 1, ResolveTimeout: resolve, Observer: &lost})
	plain := b.queue(t, nil, &deferred.Options{VisibilityTimeout: ttl, Owner: "B", MaxAttempts: 1})
	var aCalls, bCalls atomic.Int64
	_, err := deferred.Register(b.fqueue, "j", func(context.Context, *deferred.Job, int) error { aCalls.Add(1); return nil })
	require.NoError(t, err)
	kb, err := deferred.Register(plain, "j", func(context.Context, *deferred.Job, int) error { bCalls.Add(1); return nil })
	require.NoError(t, err)
	ids := []bson.ObjectID{enqueue(t, b.ctx, kb, "x", 0), enqueue(t, b.ctx, kb, "x", 1)}
	var late atomic.Bool
	stop := b.f.DelayReplies(delay, func(c *mongotest.Command) bool {
		if recordAndClaim(c) {
			late.Store(true)
		}
		return late.Load()
	})
	defer stop()
	stopA := run(t, b.fqueue)
	// Job 1 is available, at attempt 0, both before the command that
	// claims it lands and after A gave it back: only A's report of the
	// lost key (sent after it gave job 1 back) tells the second.
	waitFor(t, time.Minute, "job 1 given back", func() bool {
		if !late.Load() || len(lost.list()) == 0 {
			return false
		}
		job, err := plain.Job(b.ctx, ids[1])
		require.NoError(t, err)
		return job.State == deferred.StateAvailable && job.Attempt == 0 && !job.MayHaveApplied
	})
	stop()
	stopA()
	run(t, plain)
	j1 := wait(t, plain, ids[1])
	require.Equal(t, deferred.StateCompleted, j1.State)
	require.Equal(t, 1, j1.Attempt)
	require.False(t, j1.MayHaveApplied)
	require.Equal(t, int64(1), aCalls.Load(), "A ran job 0 only")
	require.Equal(t, int64(1), bCalls.Load(), "B ran job 1")
	// A reports the lost claim, and never as job 1's interruption: job 1
	// never started on A.
	got := lost.list()
	require.NotEmpty(t, got, "A reports that it lost the key")
	for _, e := range got {
		require.Equal(t, `"x"`, e.Key)
		require.NotEqual(t, ids[1], e.ID, "job 1 never started on A")
	}
}

// runErrors records the QueueError events of the "run" step: a worker's
// lost claims on keys.
type runErrors struct {
	mu  sync.Mutex
	got []observe.Event
}

func (r *runErrors) Start(ctx context.Context, _ observe.Event) context.Context { return ctx }

func (r *runErrors) Observe(_ context.Context, e observe.Event) {
	if e.Kind != observe.QueueError || e.Op != "run" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, e)
}

func (r *runErrors) list() []observe.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

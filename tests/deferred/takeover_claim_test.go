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
	"github.com/mongocas/mongocas/observe"
)

// aheadOf matches the worker's read of a key's places from the job whose
// place is p on (the read ahead of a run).
func aheadOf(jobs string, p *atomic.Value) mongotest.Match {
	return func(c *mongotest.Command) bool {
		if c.Name != "find" || c.Collection != jobs {
			return false
		}
		want, _ := p.Load().(string)
		v, err := c.Body.LookupErr("filter", "p", "$gte")
		return err == nil && want != "" && v.StringValue() == want
	}
}

// placeOfJob returns, ready for aheadOf, the place of job id as stored.
func placeOfJob(t testing.TB, b *faultyBundle, id bson.ObjectID) *atomic.Value {
	t.Helper()
	var raw bson.Raw
	require.NoError(t, b.jobs.FindOne(b.ctx, bson.D{{Key: "_id", Value: id}}).Decode(&raw))
	var place atomic.Value
	place.Store(raw.Lookup("p").StringValue())
	return &place
}

// TestJobPutBackBetweenTheNextHoldersReadAndClaimIsNotCharged: worker 0
// records job a and claims job J in one command, then is cut off past its
// lease before J's handler starts. Worker 1 takes the key and reads J
// running under worker 0's claim (the reply of that read is slow). Worker 0
// comes back, learns it lost the key and puts J back (never started:
// available, attempt given back), as DESIGN.md promises. Worker 1's claim,
// conditioned on J's claim id alone, then lands on the job put back, and
// worker 1 treats it as a lost worker's job: it counts the attempt it read
// and marks it as possibly applied. With MaxAttempts 1 J is made dead
// ("did not report") without its handler ever being called. The invariant
// of DESIGN.md (Claims of jobs): "W applies only while the job is exactly
// as W's worker last knew it".
func TestJobPutBackBetweenTheNextHoldersReadAndClaimIsNotCharged(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	var b *faultyBundle
	var jID atomic.Value // bson.ObjectID of J, once enqueued
	var once sync.Once
	claimedJ := make(chan struct{})
	b = setupFaulty(t, &deferred.Options{Owner: "w0", VisibilityTimeout: ttl, MaxAttempts: 1,
		Observer: onEvent(func(e observe.Event) {
			id, _ := jID.Load().(bson.ObjectID)
			if e.Kind == observe.JobClaimed && e.ID == id {
				// J is claimed by the record of a: cut worker 0 off past
				// its lease before J's handler starts.
				once.Do(func() {
					close(claimedJ)
					b.f.Pause(2 * ttl)
					time.Sleep(2 * ttl)
				})
			}
		})})
	var calls [2]atomic.Int64
	handler := func(_ context.Context, _ *deferred.Job, i int) error { calls[i].Add(1); return nil }
	k0, err := deferred.Register(b.fqueue, "j", handler)
	require.NoError(t, err)
	f1 := b.db.Faulty(t, nil)
	q1 := b.queue(t, f1.Database, &deferred.Options{Owner: "w1", VisibilityTimeout: ttl, MaxAttempts: 1})
	_, err = deferred.Register(q1, "j", handler)
	require.NoError(t, err)

	a := enqueue(t, b.ctx, k0, "x", 0)
	j := enqueue(t, b.ctx, k0, "x", 1)
	jID.Store(j)
	place := placeOfJob(t, b, j)
	// Worker 1's read of J's place is answered late (as seen at the server
	// when it was sent): the reply of a slow network.
	stopDelay := f1.DelayReplies(4*time.Second, aheadOf(b.jobs.Name(), place))
	defer stopDelay()

	run(t, b.fqueue)
	<-claimedJ
	run(t, q1) // worker 1: another process, waiting for worker 0's key

	plain := b.queue(t, nil, nil)
	// The scenario: worker 0's put-back lands before worker 1's claim (else
	// this is the window DESIGN.md accepts: a worker cut off before it
	// learns).
	putBack := false
	waitFor(t, time.Minute, "J put back, or finished", func() bool {
		cur, err := plain.Job(b.ctx, j)
		require.NoError(t, err)
		putBack = putBack || cur.State == deferred.StateAvailable && cur.Attempt == 0
		return putBack || cur.State == deferred.StateDead || cur.State == deferred.StateCompleted
	})
	require.True(t, putBack, "scenario not reached: worker 1 claimed J before worker 0's put-back landed (timing)")
	ja := wait(t, plain, a)
	jj := wait(t, plain, j)
	t.Logf("a: %s attempt %d; J: %s attempt %d mayHaveApplied %v errors %+v; calls %d %d",
		ja.State, ja.Attempt, jj.State, jj.Attempt, jj.MayHaveApplied, jj.Errors, calls[0].Load(), calls[1].Load())
	require.Equal(t, deferred.StateCompleted, ja.State)
	require.Equal(t, deferred.StateCompleted, jj.State, "J was put back unstarted by its lost worker, yet it is %s: %+v", jj.State, jj.Errors)
	require.Equal(t, 1, jj.Attempt)
	require.False(t, jj.MayHaveApplied, "J never started anywhere, yet it is marked as possibly applied")
	require.Equal(t, int64(1), calls[1].Load(), "J's handler calls")
}

// TestSnoozeLandingBetweenTheNextHoldersReadAndClaimIsKept: worker 0's job
// J snoozes for an hour; the write that records the snooze is held in the
// network, and worker 0 is then cut off from the server (it can neither
// settle the snooze nor renew its key). Worker 1 takes the key and reads J
// running under worker 0's claim (the reply of that read is slow). The held
// snooze then lands, as its filter allows (J running under worker 0's
// claim: DESIGN.md's rule 3). Worker 1's claim, conditioned on J's claim id
// alone, lands on the snoozed job: J runs at once, an hour early, and is
// counted as a lost worker's job (charged, marked as possibly applied)
// though its only attempt snoozed and wrote nothing. (Had the snooze been
// lost instead, worker 1's take-over would look the same; but the snooze
// landed before worker 1's claim, and the claim applied to a job that was
// no longer as worker 1 read it: DESIGN.md's invariant.)
func TestSnoozeLandingBetweenTheNextHoldersReadAndClaimIsKept(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	b := setupFaulty(t, &deferred.Options{Owner: "w0", VisibilityTimeout: ttl, ResolveTimeout: time.Second})
	var calls atomic.Int64
	handler := func(context.Context, *deferred.Job, int) error {
		if calls.Add(1) == 1 {
			return deferred.Snooze(time.Hour)
		}
		return nil
	}
	k0, err := deferred.Register(b.fqueue, "j", handler)
	require.NoError(t, err)
	f1 := b.db.Faulty(t, nil)
	q1 := b.queue(t, f1.Database, &deferred.Options{Owner: "w1", VisibilityTimeout: ttl})
	_, err = deferred.Register(q1, "j", handler)
	require.NoError(t, err)

	j := enqueue(t, b.ctx, k0, "x", 0)
	place := placeOfJob(t, b, j)

	// Worker 0's snooze is held; from then on worker 0 reaches nothing.
	var blackout atomic.Bool
	isSnooze := jobWrite(func(s bson.Raw) bool { return setsState(s, deferred.StateAvailable) && incsAttempt(s, -1) })
	held := b.f.HoldNext(func(c *mongotest.Command) bool {
		if isSnooze(c) {
			blackout.Store(true)
			return true
		}
		return false
	})
	for range 500 {
		b.f.ErrorBeforeApply(func(*mongotest.Command) bool { return blackout.Load() },
			mongotest.ServerError{Code: 2, CodeName: "BadValue", Errmsg: "mongotest: worker 0 is cut off"})
	}
	run(t, b.fqueue)
	<-held.Fired()
	var kd bson.Raw
	require.NoError(t, b.db.Collection(b.jobs.Name()+"_keys").FindOne(b.ctx, bson.D{{Key: "_id", Value: "x"}}).Decode(&kd))
	epoch, _ := kd.Lookup("_lease", "epoch").AsInt64OK()

	// Worker 1's read of J's place is answered late.
	stopDelay := f1.DelayReplies(4*time.Second, aheadOf(b.jobs.Name(), place))
	defer stopDelay()
	run(t, q1)
	waitFor(t, time.Minute, "worker 1 holds the key", func() bool {
		require.NoError(t, b.db.Collection(b.jobs.Name()+"_keys").FindOne(b.ctx, bson.D{{Key: "_id", Value: "x"}}).Decode(&kd))
		e, ok := kd.Lookup("_lease", "epoch").AsInt64OK()
		return ok && e > epoch
	})
	time.Sleep(time.Second) // worker 1 has read J (running), its reply is on the way
	reply, err := held.Deliver(b.ctx)
	require.NoError(t, err)
	n, _ := reply.Lookup("n").AsInt64OK()
	require.Equal(t, int64(1), n, "the snooze, sent under worker 0's claim, lands while J runs under it")

	time.Sleep(8 * time.Second) // worker 1's read arrives, and it acts on it
	plain := b.queue(t, nil, nil)
	jj, err := plain.Job(b.ctx, j)
	require.NoError(t, err)
	t.Logf("J: %s attempt %d runAt in %v mayHaveApplied %v errors %+v; calls %d",
		jj.State, jj.Attempt, time.Until(jj.RunAt).Round(time.Minute), jj.MayHaveApplied, jj.Errors, calls.Load())
	require.Equal(t, int64(1), calls.Load(), "J snoozed for an hour, yet its handler was called again at once")
	require.Equal(t, deferred.StateAvailable, jj.State, "J snoozed for an hour")
	require.False(t, jj.MayHaveApplied, "J only snoozed, yet it is marked as possibly applied")
}

// TestSnoozeWhoseOutcomeIsUnknownIsKeptByTheNextClaim: one process. Job J
// snoozes for an hour; the write that records the snooze is held in the
// network and its resends are refused, so the worker does not know whether
// it landed. It gives the key up (released at once: only a claim's unknown
// outcome keeps a key, DESIGN.md rule 4) and takes it again at its next
// poll, reading J running under its earlier claim (the reply of that read is
// slow). The held snooze lands meanwhile, as its filter allows. The next
// claim, conditioned on J's claim id alone, lands on the snoozed job: J runs
// at once, an hour early, counted as a lost worker's job (marked as possibly
// applied) though its only attempt snoozed and wrote nothing. The same
// reach as the test above, in one process and with no lease expiring: a
// write under a claim whose outcome is unknown does not keep the key.
func TestSnoozeWhoseOutcomeIsUnknownIsKeptByTheNextClaim(t *testing.T) {
	t.Parallel()
	b := setupFaulty(t, nil)
	var calls atomic.Int64
	k, err := deferred.Register(b.fqueue, "j", func(context.Context, *deferred.Job, int) error {
		if calls.Add(1) == 1 {
			return deferred.Snooze(time.Hour)
		}
		return nil
	})
	require.NoError(t, err)
	j := enqueue(t, b.ctx, k, "x", 0)
	place := placeOfJob(t, b, j)
	isSnooze := jobWrite(func(s bson.Raw) bool { return setsState(s, deferred.StateAvailable) && incsAttempt(s, -1) })
	held := b.f.HoldNext(isSnooze)
	for range 50 {
		b.f.ErrorBeforeApply(isSnooze, mongotest.ServerError{Code: 2, CodeName: "BadValue", Errmsg: "mongotest: the snooze's resend is refused"})
	}
	// From the snooze on, the worker's reads of J's place are answered late.
	stopDelay := b.f.DelayReplies(4*time.Second, func(c *mongotest.Command) bool { return held.HasFired() && aheadOf(b.jobs.Name(), place)(c) })
	defer stopDelay()
	run(t, b.fqueue)
	<-held.Fired()
	time.Sleep(2 * time.Second) // the worker gave the key up, took it again and read J running
	before, err := b.obs.Job(b.ctx, j)
	require.NoError(t, err)
	t.Logf("before the held snooze: J %s attempt %d", before.State, before.Attempt)
	reply, err := held.Deliver(b.ctx)
	require.NoError(t, err)
	n, _ := reply.Lookup("n").AsInt64OK()
	require.Equal(t, int64(1), n, "the held snooze lands while J runs under the claim it was sent under")
	time.Sleep(6 * time.Second) // the slow read arrives, and the worker acts on it
	plain := b.queue(t, nil, nil)
	jj, err := plain.Job(b.ctx, j)
	require.NoError(t, err)
	t.Logf("J: %s attempt %d runAt in %v mayHaveApplied %v errors %+v; calls %d",
		jj.State, jj.Attempt, time.Until(jj.RunAt).Round(time.Minute), jj.MayHaveApplied, jj.Errors, calls.Load())
	require.Equal(t, int64(1), calls.Load(), "J snoozed for an hour, yet its handler was called again at once")
	require.Equal(t, deferred.StateAvailable, jj.State, "J snoozed for an hour")
	require.False(t, jj.MayHaveApplied, "J only snoozed, yet it is marked as possibly applied")
}

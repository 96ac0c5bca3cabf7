package deferred_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
)

// setsState reports whether the update statement s sets the job's state to
// st.
func setsState(s bson.Raw, st deferred.State) bool {
	v, err := s.LookupErr("u", "$set", "state")
	return err == nil && v.StringValue() == string(st)
}

// incsAttempt reports whether the update statement s adds by to the job's
// attempt.
func incsAttempt(s bson.Raw, by int64) bool {
	v, err := s.LookupErr("u", "$inc", "attempt")
	n, ok := v.AsInt64OK()
	return err == nil && ok && n == by
}

// claims reports whether the update statement s is a claim of jobs.
func claims(s bson.Raw) bool {
	_, err := s.LookupErr("u", "$set", "c")
	return err == nil && setsState(s, deferred.StateRunning) && incsAttempt(s, 1)
}

// jobWrite matches an update of the jobs collection whose statements all
// satisfy one of the predicates, in order.
func jobWrite(preds ...func(bson.Raw) bool) mongotest.Match {
	return func(c *mongotest.Command) bool {
		if c.Name != "update" || c.Collection != "jobs" {
			return false
		}
		st := statements(c)
		if len(st) != len(preds) {
			return false
		}
		for i, p := range preds {
			if !p(st[i]) {
				return false
			}
		}
		return true
	}
}

// The kinds of write a job's life sends to the jobs collection, each with
// the step of the life below in which it is first sent.
var heldWrites = []struct {
	name  string
	match mongotest.Match
	first int
}{
	{"claim", jobWrite(claims), stepSnoozed},
	{"snooze", jobWrite(func(s bson.Raw) bool { return setsState(s, deferred.StateAvailable) && incsAttempt(s, -1) }), stepSnoozed},
	{"fail", jobWrite(func(s bson.Raw) bool { return setsState(s, deferred.StateRetryable) }), stepRetryable},
	// The void of the claim (no copy of it can land once this has), then
	// the put-back of the job running under it.
	{"put back", jobWrite(func(s bson.Raw) bool {
		_, err := s.LookupErr("u", "$set", "c")
		return err == nil && !setsState(s, deferred.StateRunning)
	}, func(s bson.Raw) bool { return setsState(s, deferred.StateAvailable) && incsAttempt(s, -1) }), stepPutBack},
	{"dead", jobWrite(func(s bson.Raw) bool { return setsState(s, deferred.StateDead) }), stepDead},
	{"record and claim", recordAndClaim, stepSecondRun},
	{"record", jobWrite(func(s bson.Raw) bool { return setsState(s, deferred.StateCompleted) }), stepSecondRun},
}

// The steps of the life of job a (a key's head, two jobs b1 and b2 behind
// it), after each of which a held copy is released.
const (
	stepSnoozed   = iota // a snoozes (its first call)
	stepRetryable        // a fails (retryable)
	stepPutBack          // Run stops while a runs: a is put back
	stepDead             // a new Run takes the key; a fails for good (dead)
	stepSecondRun        // b1 and b2 run, in one run (record-and-claim, record)
	stepRequeued         // a, requeued, runs again and completes
	steps
)

var stepNames = [steps]string{"snoozed", "retryable", "put back", "dead", "second run", "requeued"}

// TestEveryQueueWriteHeldAndReleasedLateMatchesNothing holds, in turn, the
// first copy of each kind of write a job's life sends (its claim, snooze,
// failure, put-back with the void of its claim, death, the record-and-claim
// command and the lone record), lets the worker settle it (the reply is
// lost: it reads and sends again), and releases the held copy after each
// later step of the life. The claim identity (deferred/DESIGN.md, Claims
// of jobs) promises that the copy matches nothing, so that every job ends
// as if the copy had never existed: a is completed after its requeue in
// its first attempt, b1 and b2 in theirs, none marked as possibly applied,
// every handler called exactly as the life says.
func TestEveryQueueWriteHeldAndReleasedLateMatchesNothing(t *testing.T) {
	t.Parallel()
	for _, w := range heldWrites {
		for release := w.first; release < steps; release++ {
			t.Run(fmt.Sprintf("%s released after %s", w.name, stepNames[release]), func(t *testing.T) {
				t.Parallel()
				heldWriteLife(t, w.match, w.first, release)
			})
		}
	}
}

// heldWriteLife runs the life of the test above with the first write that
// matches held, and releases it after step release.
func heldWriteLife(t *testing.T, match mongotest.Match, first, release int) {
	t.Helper()
	b := setupFaulty(t, &deferred.Options{MaxAttempts: 5,
		Backoff: retry.Policy{InitialInterval: 200 * time.Millisecond, MaxInterval: 200 * time.Millisecond}})
	var aCalls, b1Calls, b2Calls atomic.Int64
	blocking := make(chan struct{}, 1)
	k, err := deferred.Register(b.fqueue, "j", func(ctx context.Context, _ *deferred.Job, i int) error {
		switch i {
		case 1:
			b1Calls.Add(1)
			return nil
		case 2:
			b2Calls.Add(1)
			return nil
		}
		switch aCalls.Add(1) {
		case 1:
			return deferred.Snooze(200 * time.Millisecond)
		case 2:
			return errors.New("a fails once")
		case 3:
			blocking <- struct{}{}
			<-ctx.Done() // Run stops
			return ctx.Err()
		case 4:
			return retry.Permanent(errors.New("a fails for good"))
		}
		return nil
	})
	require.NoError(t, err)
	a := enqueue(t, b.ctx, k, "x", 0)
	held := b.f.HoldNext(match)
	job := func(id bson.ObjectID) *deferred.Job {
		j, err := b.obs.Job(b.ctx, id)
		require.NoError(t, err)
		return j
	}
	stop := run(t, b.fqueue)
	var b1, b2 bson.ObjectID
	for step := range steps {
		switch step {
		case stepSnoozed:
			// Or later: the snooze is short, and a machine under load may
			// not look in time.
			waitFor(t, time.Minute, "a snoozed", func() bool {
				return aCalls.Load() >= 2 || aCalls.Load() == 1 && job(a).State == deferred.StateAvailable
			})
		case stepRetryable:
			waitFor(t, time.Minute, "a retryable", func() bool {
				return aCalls.Load() >= 3 || aCalls.Load() == 2 && job(a).State == deferred.StateRetryable
			})
			// b1 and b2 wait behind a: enqueued now, they run in one run
			// once a is dead.
			b1, b2 = enqueue(t, b.ctx, k, "x", 1), enqueue(t, b.ctx, k, "x", 2)
		case stepPutBack:
			select {
			case <-blocking:
			case <-time.After(time.Minute):
				dumpQueue(t, b.obs)
				t.Fatal("a's third call never came")
			}
			stop()
			j := job(a)
			require.Equal(t, deferred.StateAvailable, j.State, "Run stopped while a ran: a is put back")
			stop = run(t, b.fqueue)
		case stepDead:
			waitFor(t, time.Minute, "a dead", func() bool { return job(a).State == deferred.StateDead })
		case stepSecondRun:
			wait(t, b.obs, b1)
			wait(t, b.obs, b2)
		case stepRequeued:
			require.NoError(t, b.obs.Requeue(b.ctx, a))
			wait(t, b.obs, a)
		}
		if step == first {
			require.True(t, held.HasFired(), "the write held was sent by step %s", stepNames[step])
		}
		if step == release {
			reply, err := held.Deliver(b.ctx)
			require.NoError(t, err)
			n, _ := reply.Lookup("n").AsInt64OK()
			require.Zero(t, n, "the held copy applied after step %s: %v", stepNames[step], reply)
		}
	}
	stop()
	ja, jb1, jb2 := job(a), job(b1), job(b2)
	for _, j := range []*deferred.Job{ja, jb1, jb2} {
		require.Equal(t, deferred.StateCompleted, j.State, "job %d: %+v", j.Seq, j.Errors)
		require.Equal(t, 1, j.Attempt, "job %d: one attempt since it was (re)queued: %+v", j.Seq, j.Errors)
		require.False(t, j.MayHaveApplied, "job %d never wrote", j.Seq)
	}
	require.Equal(t, []int64{5, 1, 1}, []int64{aCalls.Load(), b1Calls.Load(), b2Calls.Load()}, "handler calls of a, b1, b2")
}

package observe_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/observe"
)

// recorder keeps the kinds it sees, and marks the contexts of Start.
type recorder struct {
	name  string
	mu    sync.Mutex
	kinds []observe.Kind
}

type markKey struct{}

func (r *recorder) Start(ctx context.Context, e observe.Event) context.Context {
	r.Observe(ctx, e)
	prev, _ := ctx.Value(markKey{}).(string)
	return context.WithValue(ctx, markKey{}, prev+r.name)
}

func (r *recorder) Observe(_ context.Context, e observe.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kinds = append(r.kinds, e.Kind)
}

func TestJoin(t *testing.T) {
	require.Nil(t, observe.Join())
	require.Nil(t, observe.Join(nil, nil))
	a, b, c := &recorder{name: "a"}, &recorder{name: "b"}, &recorder{name: "c"}
	require.Same(t, a, observe.Join(nil, a, nil))

	j := observe.Join(observe.Join(a, nil, b), c)
	ctx := j.Start(t.Context(), observe.Event{Kind: observe.OpStart})
	require.Equal(t, "abc", ctx.Value(markKey{}), "Start chains the contexts in order, flattened")
	j.Observe(ctx, observe.Event{Kind: observe.OpEnd})
	for _, r := range []*recorder{a, b, c} {
		require.Equal(t, []observe.Kind{observe.OpStart, observe.OpEnd}, r.kinds)
	}
}

// TestSlogLevels checks the level of each event: quiet at Info in normal
// operation, a warning for a lost lease or an unknown outcome.
func TestSlogLevels(t *testing.T) {
	cause := errors.New("boom")
	cases := []struct {
		e     observe.Event
		level slog.Level
	}{
		{observe.Event{Kind: observe.OpStart, Op: "modify"}, slog.LevelDebug},
		{observe.Event{Kind: observe.OpEnd, Outcome: observe.OK}, slog.LevelDebug},
		{observe.Event{Kind: observe.OpEnd, Outcome: observe.OutcomeConflict, Err: cause}, slog.LevelDebug},
		{observe.Event{Kind: observe.OpEnd, Outcome: observe.OutcomeHeld, Err: cause}, slog.LevelDebug},
		{observe.Event{Kind: observe.OpEnd, Outcome: observe.OutcomeNotFound, Err: cause}, slog.LevelDebug},
		{observe.Event{Kind: observe.OpEnd, Outcome: observe.OutcomeAborted, Err: cause}, slog.LevelDebug},
		{observe.Event{Kind: observe.OpEnd, Outcome: observe.OutcomeError, Err: cause}, slog.LevelInfo},
		{observe.Event{Kind: observe.OpEnd, Outcome: observe.OutcomeBudget, Err: cause}, slog.LevelInfo},
		{observe.Event{Kind: observe.OpEnd, Outcome: observe.OutcomeUnknown, Err: cause}, slog.LevelWarn},
		{observe.Event{Kind: observe.Conflict, Expected: 4, Current: 5}, slog.LevelDebug},
		{observe.Event{Kind: observe.Retry, Attempt: 1, Delay: time.Millisecond, Err: cause}, slog.LevelDebug},
		{observe.Event{Kind: observe.BudgetRefused, Attempt: 3, Err: cause}, slog.LevelInfo},
		{observe.Event{Kind: observe.Ambiguous, Err: cause}, slog.LevelDebug},
		{observe.Event{Kind: observe.Settled, Settlement: observe.SettledLanded}, slog.LevelDebug},
		{observe.Event{Kind: observe.Settled, Settlement: observe.SettledResent}, slog.LevelDebug},
		{observe.Event{Kind: observe.Settled, Settlement: observe.SettledNotLanded}, slog.LevelDebug},
		{observe.Event{Kind: observe.Settled, Settlement: observe.SettledUnknown, Err: cause}, slog.LevelInfo},
		{observe.Event{Kind: observe.LeaseAcquired, Epoch: 7}, slog.LevelDebug},
		{observe.Event{Kind: observe.LeaseRenewed, Epoch: 7}, slog.LevelDebug},
		{observe.Event{Kind: observe.LeaseRenewFailed, Epoch: 7, Err: cause}, slog.LevelInfo},
		{observe.Event{Kind: observe.LeaseLost, Epoch: 7, Reason: "taken_over", Holder: "b"}, slog.LevelWarn},
		{observe.Event{Kind: observe.LeaseReleased, Epoch: 7}, slog.LevelDebug},
		{observe.Event{Kind: observe.LeaseHeld, Holder: "b", Epoch: 8}, slog.LevelDebug},
		{observe.Event{Kind: observe.ClockSync, Bound: time.Millisecond}, slog.LevelDebug},
		{observe.Event{Kind: observe.JobEnqueued, Op: "enqueue", Name: "spend", Key: `"ana"`}, slog.LevelDebug},
		{observe.Event{Kind: observe.JobClaimed, Op: "run", Attempt: 1, Age: time.Second}, slog.LevelDebug},
		{observe.Event{Kind: observe.JobCompleted, Op: "run", Attempt: 1, Outcome: observe.OK}, slog.LevelDebug},
		{observe.Event{Kind: observe.JobSnoozed, Op: "run", Attempt: 1, Delay: time.Minute}, slog.LevelDebug},
		{observe.Event{Kind: observe.JobFailed, Op: "run", Attempt: 1, Outcome: observe.OutcomeError, Err: cause}, slog.LevelInfo},
		{observe.Event{Kind: observe.JobDead, Op: "run", Attempt: 10, Outcome: observe.OutcomeError, Err: cause}, slog.LevelWarn},
		{observe.Event{Kind: observe.JobRequeued, Op: "requeue"}, slog.LevelDebug},
		{observe.Event{Kind: observe.JobCancelled, Op: "cancel"}, slog.LevelDebug},
		{observe.Event{Kind: observe.QueueKeySkipped, Op: "run", Reason: "no_handler"}, slog.LevelWarn},
		{observe.Event{Kind: observe.QueueError, Op: "sweep", Err: cause}, slog.LevelWarn},
		{observe.Event{Kind: observe.KeyCompleted, Op: "do", ID: "k1", Attempt: 1}, slog.LevelDebug},
		{observe.Event{Kind: observe.KeyReplayed, Op: "do", ID: "k1"}, slog.LevelDebug},
		{observe.Event{Kind: observe.KeyInProgress, Op: "do", ID: "k1", Holder: "a"}, slog.LevelDebug},
		{observe.Event{Kind: observe.KeyMismatch, Op: "do", ID: "k1"}, slog.LevelWarn},
	}
	for _, c := range cases {
		var buf bytes.Buffer
		o := observe.Slog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
		o.Observe(t.Context(), c.e)
		line := buf.String()
		require.Contains(t, line, "level="+c.level.String()+" ", "%v %v", c.e.Kind, c.e.Outcome)
		require.Contains(t, line, `msg="mongocas `+c.e.Kind.String()+`"`)
		if c.e.Err != nil {
			require.Contains(t, line, "err=boom")
		}
	}
}

// TestSlogAttributes checks that the fields of an event reach the log.
func TestSlogAttributes(t *testing.T) {
	var buf bytes.Buffer
	o := observe.Slog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	ctx := o.Start(t.Context(), observe.Event{Kind: observe.OpStart, Op: "modify", Database: "shop", Collection: "items", ID: "mug"})
	require.Equal(t, t.Context(), ctx, "Start keeps the context")
	o.Observe(ctx, observe.Event{Kind: observe.Conflict, Op: "modify", Database: "shop", Collection: "items", ID: "mug", Expected: 41, Current: 42})
	o.Observe(ctx, observe.Event{Kind: observe.LeaseLost, Op: "", Collection: "users", Database: "app", ID: "u1", Epoch: 9, Owner: "a", Holder: "b", Reason: "taken_over", Held: 2 * time.Second})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 3)
	require.Contains(t, lines[0], "op=modify db=shop collection=items id=mug")
	require.Contains(t, lines[1], "expected=41 current=42")
	require.Contains(t, lines[2], "level=WARN")
	require.Contains(t, lines[2], "epoch=9 owner=a reason=taken_over held=2s holder=b")
}

// TestSlogJobAttributes: a job's name, key, attempt, age, outcome and
// delays reach the log.
func TestSlogJobAttributes(t *testing.T) {
	var buf bytes.Buffer
	o := observe.Slog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	base := observe.Event{Op: "run", Database: "shop", Collection: "jobs", ID: "j1", Name: "spend", Key: `"ana"`}
	claimed, failed := base, base
	claimed.Kind, claimed.Attempt, claimed.Age = observe.JobClaimed, 2, 3*time.Second
	failed.Kind, failed.Attempt, failed.Outcome, failed.Elapsed, failed.Delay, failed.Err = observe.JobFailed, 2, observe.OutcomeError, time.Second, 4*time.Second, errors.New("boom")
	o.Observe(t.Context(), claimed)
	o.Observe(t.Context(), failed)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2)
	require.Contains(t, lines[0], `msg="mongocas job.claimed" op=run db=shop collection=jobs id=j1 name=spend key="\"ana\"" attempt=2 age=3s`)
	require.Contains(t, lines[1], "level=INFO")
	require.Contains(t, lines[1], "attempt=2 outcome=error elapsed=1s delay=4s err=boom")
}

// TestSlogInfoAllocatesNothing: at Info, the events of normal operation
// cost no allocation.
func TestSlogInfoAllocatesNothing(t *testing.T) {
	o := observe.Slog(slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))) // Info
	ctx := t.Context()
	start := observe.Event{Kind: observe.OpStart, Op: "modify", Database: "shop", Collection: "items", ID: "mug"}
	end := observe.Event{Kind: observe.OpEnd, Op: "modify", Database: "shop", Collection: "items", ID: "mug", Outcome: observe.OK, Elapsed: time.Millisecond, Attempt: 1}
	retry := observe.Event{Kind: observe.Retry, Attempt: 1, Delay: time.Millisecond, Err: context.DeadlineExceeded}
	allocs := testing.AllocsPerRun(200, func() {
		c := o.Start(ctx, start)
		o.Observe(c, retry)
		o.Observe(c, end)
	})
	require.Zero(t, allocs)
}

func TestCounters(t *testing.T) {
	var c observe.Counters
	ctx := c.Start(t.Context(), observe.Event{Kind: observe.OpStart})
	require.Equal(t, t.Context(), ctx)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				c.Observe(ctx, observe.Event{Kind: observe.Retry})
			}
		})
	}
	wg.Wait()
	c.Observe(ctx, observe.Event{Kind: observe.Settled, Settlement: observe.SettledUnknown})
	c.Observe(ctx, observe.Event{Kind: observe.Settled, Settlement: observe.SettledLanded})
	c.Observe(ctx, observe.Event{Kind: observe.OpEnd, Outcome: observe.OutcomeUnknown})
	c.Observe(ctx, observe.Event{Kind: observe.OpEnd, Outcome: observe.OutcomeConflict})
	c.Observe(ctx, observe.Event{Kind: observe.Kind(200)}) // unknown kinds are ignored

	require.Equal(t, int64(800), c.Count(observe.Retry))
	require.Equal(t, int64(2), c.Count(observe.Settled))
	require.Equal(t, int64(1), c.Settled(observe.SettledUnknown))
	require.Equal(t, int64(1), c.Settled(observe.SettledLanded))
	require.Equal(t, int64(1), c.Failed(), "a conflict is an answer, not a failure")
	require.Zero(t, c.Count(observe.Kind(200)))
	require.Equal(t, "operations 1 (failed 1), conflicts 0, retries 800, budget refusals 0, "+
		"ambiguous writes 0 (landed 1, resent 0, not landed 0, unknown 1), "+
		"leases acquired 0, held by another 0, renewed 0, renewals failed 0, lost 0, released 0, clock syncs 0", c.String())
	require.Zero(t, testing.AllocsPerRun(100, func() { c.Observe(ctx, observe.Event{Kind: observe.Conflict}) }))

	n := c.Counts()
	require.Equal(t, observe.Counts{Operations: 1, Failed: 1, Retries: 800, Conflicts: 101, Landed: 1, Unknown: 1}, n)
	require.Equal(t, observe.Counts{Operations: 2, Failed: 2, Retries: 1600, Conflicts: 202, Landed: 2, Unknown: 2}, n.Add(n))
}

// TestCountersJobsAndKeys: the job and idempotency events are counted, and
// the line names them once any is not zero.
func TestCountersJobsAndKeys(t *testing.T) {
	var c observe.Counters
	ctx := t.Context()
	for _, k := range []observe.Kind{
		observe.JobEnqueued, observe.JobClaimed, observe.JobFailed, observe.JobClaimed, observe.JobCompleted,
		observe.JobDead, observe.JobSnoozed, observe.JobRequeued, observe.JobCancelled, observe.QueueKeySkipped, observe.QueueError,
		observe.KeyCompleted, observe.KeyReplayed, observe.KeyReplayed, observe.KeyInProgress, observe.KeyMismatch,
	} {
		c.Observe(ctx, observe.Event{Kind: k})
	}
	n := c.Counts()
	require.Equal(t, observe.Counts{
		JobsEnqueued: 1, JobsClaimed: 2, JobsCompleted: 1, JobsFailed: 1, JobsDead: 1, JobsSnoozed: 1, JobsRequeued: 1, JobsCancelled: 1,
		KeysSkipped: 1, QueueErrors: 1, KeysCompleted: 1, KeysReplayed: 2, KeysInProgress: 1, KeysMismatched: 1,
	}, n)
	require.Equal(t, int64(4), n.Add(n).KeysReplayed)
	require.Contains(t, c.String(), ", jobs enqueued 1, claimed 2, completed 1, failed 1, dead 1, snoozed 1, requeued 1, cancelled 1, keys skipped 1, queue errors 1")
	require.Contains(t, c.String(), ", idempotent requests completed 1, replayed 2, in progress 1, mismatched 1")
}

func TestNames(t *testing.T) {
	require.Equal(t, "lease.lost", observe.LeaseLost.String())
	require.Equal(t, "job.dead", observe.JobDead.String())
	require.Equal(t, "idempotency.mismatch", observe.KeyMismatch.String())
	require.Equal(t, "Kind(0)", observe.Kind(0).String())
	require.Equal(t, "resent", observe.SettledResent.String())
	require.Equal(t, "Settlement(9)", observe.Settlement(9).String())
	require.True(t, observe.OutcomeUnknown.Failed())
	require.False(t, observe.OutcomeGuardFailed.Failed())
}

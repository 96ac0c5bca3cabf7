package observe_test

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
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
)

// queueFixture is a Queue that reports to rec, polling and backing off
// quickly, with one handler, "step", whose behaviour the test sets.
type queueFixture struct {
	db   *mongotest.DB
	q    *deferred.Queue
	kind *deferred.Kind[int]
	rec  *recorder
	// handle is the handler's behaviour: the attempt's error.
	handle atomic.Pointer[func(job *deferred.Job) error]
}

func newQueue(t *testing.T) *queueFixture {
	t.Helper()
	f := &queueFixture{db: mongotest.New(t), rec: &recorder{}}
	q, err := deferred.New(f.db.Collection("jobs"), &deferred.Options{
		Observer:     f.rec,
		PollInterval: 100 * time.Millisecond,
		Backoff:      retry.Policy{InitialInterval: 20 * time.Millisecond, MaxInterval: 20 * time.Millisecond},
	})
	require.NoError(t, err)
	f.q = q
	f.kind, err = deferred.Register(q, "step", func(_ context.Context, job *deferred.Job, _ int) error {
		return (*f.handle.Load())(job)
	})
	require.NoError(t, err)
	f.set(func(*deferred.Job) error { return nil })
	return f
}

func (f *queueFixture) set(fn func(job *deferred.Job) error) { f.handle.Store(&fn) }

// run starts the Queue's workers until the test ends, or until the
// returned stop is called.
func (f *queueFixture) run(t *testing.T) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = f.q.Run(ctx) })
	stop = func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return stop
}

// wait waits for the job id to finish and for the event of its end (the
// worker reports it after the write the record shows), and returns the job.
func (f *queueFixture) wait(t *testing.T, id bson.ObjectID) *deferred.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	job, err := f.q.Wait(ctx, id, 10*time.Millisecond)
	require.NoError(t, err)
	ends := map[deferred.State]observe.Kind{deferred.StateCompleted: observe.JobCompleted, deferred.StateDead: observe.JobDead}
	if end, ok := ends[job.State]; ok {
		require.Eventually(t, func() bool {
			for _, e := range f.rec.all() {
				if e.Kind == end && e.ID == id {
					return true
				}
			}
			return false
		}, time.Minute, time.Millisecond, "the %v event of job %s", end, id.Hex())
	}
	return job
}

// jobLines returns the job events of the job id, one line each, with the
// facts a test can know exactly, and checks what every one must carry.
func (f *queueFixture) jobLines(t *testing.T, id bson.ObjectID) []string {
	t.Helper()
	var out []string
	for _, e := range f.rec.all() {
		if !strings.HasPrefix(e.Kind.String(), "job.") || e.ID != id {
			continue
		}
		require.Equal(t, f.db.Name(), e.Database, "%v", e.Kind)
		require.Equal(t, "jobs", e.Collection, "%v", e.Kind)
		require.Equal(t, "step", e.Name, "%v", e.Kind)
		s := fmt.Sprintf("%s %s key=%s", e.Kind, e.Op, e.Key)
		switch e.Kind {
		case observe.JobClaimed:
			s += fmt.Sprintf(" attempt=%d", e.Attempt)
		case observe.JobCompleted, observe.JobFailed, observe.JobDead:
			s += fmt.Sprintf(" attempt=%d %s cause=%s", e.Attempt, e.Outcome, class(e.Err))
		case observe.JobSnoozed:
			s += fmt.Sprintf(" attempt=%d delay=%v", e.Attempt, e.Delay)
		default:
		}
		out = append(out, s)
	}
	return out
}

// requireNoQueueErrors: nothing went wrong in the workers.
func (f *queueFixture) requireNoQueueErrors(t *testing.T) {
	t.Helper()
	for _, e := range f.rec.all() {
		require.NotEqual(t, observe.QueueError, e.Kind, "queue error: %s %v", e.Op, e.Err)
		require.NotEqual(t, observe.QueueKeySkipped, e.Kind)
	}
}

// event returns the first event of kind k about the job id.
func (f *queueFixture) event(t *testing.T, k observe.Kind, id bson.ObjectID) observe.Event {
	t.Helper()
	for _, e := range f.rec.all() {
		if e.Kind == k && e.ID == id {
			return e
		}
	}
	require.Failf(t, "no event", "%v of job %s", k, id.Hex())
	return observe.Event{}
}

var errFlaky = errors.New("flaky")

// TestJobFailsOnceThenCompletes: a job's life through a real server:
// enqueued, claimed, failed on attempt 1 (and backed off), claimed again,
// completed on attempt 2; its age when claimed and the backoff are
// reported.
func TestJobFailsOnceThenCompletes(t *testing.T) {
	f := newQueue(t)
	f.set(func(job *deferred.Job) error {
		if job.Attempt == 1 {
			time.Sleep(5 * time.Millisecond)
			return errFlaky
		}
		return nil
	})
	id, err := f.kind.Enqueue(t.Context(), "ana", 1)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond) // an age to measure
	f.run(t)
	require.Equal(t, deferred.StateCompleted, f.wait(t, id).State)

	requireLines(t, []string{
		`job.enqueued enqueue key="ana"`,
		`job.claimed run key="ana" attempt=1`,
		`job.failed run key="ana" attempt=1 error cause=*errors.errorString`,
		`job.claimed run key="ana" attempt=2`,
		`job.completed run key="ana" attempt=2 ok cause=none`,
	}, f.jobLines(t, id))
	require.GreaterOrEqual(t, f.event(t, observe.JobClaimed, id).Age, 20*time.Millisecond, "the age counts from the enqueue")
	failed := f.event(t, observe.JobFailed, id)
	require.ErrorIs(t, failed.Err, errFlaky)
	require.Positive(t, failed.Delay, "the backoff before attempt 2")
	require.GreaterOrEqual(t, failed.Elapsed, 5*time.Millisecond, "the handler's run")
	f.requireNoQueueErrors(t)
}

// TestJobDeadRequeuedCancelled: a job that fails permanently is dead at
// once; requeued, it is claimed from attempt 1 again and dies again; then
// it is cancelled. The enqueue and the requeue are made while no worker
// runs: a worker's event may otherwise reach the Observer before that of
// the write that made the job available (see the observe package).
func TestJobDeadRequeuedCancelled(t *testing.T) {
	f := newQueue(t)
	f.set(func(*deferred.Job) error { return retry.Permanent(errFlaky) })
	id, err := f.kind.Enqueue(t.Context(), "bo", 1)
	require.NoError(t, err)
	stop := f.run(t)
	require.Equal(t, deferred.StateDead, f.wait(t, id).State)
	stop()
	require.NoError(t, f.q.Requeue(t.Context(), id))
	f.run(t)
	waitFor(t, func() bool {
		job, err := f.q.Job(t.Context(), id)
		return err == nil && job.State == deferred.StateDead && job.Attempt == 1 && len(job.Errors) == 2
	})
	require.NoError(t, f.q.Cancel(t.Context(), id))

	requireLines(t, []string{
		`job.enqueued enqueue key="bo"`,
		`job.claimed run key="bo" attempt=1`,
		`job.dead run key="bo" attempt=1 error cause=*retry.permanentError`,
		`job.requeued requeue key="bo"`,
		`job.claimed run key="bo" attempt=1`,
		`job.dead run key="bo" attempt=1 error cause=*retry.permanentError`,
		`job.cancelled cancel key="bo"`,
	}, f.jobLines(t, id))
	require.ErrorIs(t, f.event(t, observe.JobDead, id).Err, errFlaky)
	f.requireNoQueueErrors(t)
}

// TestJobSnoozed: a handler that snoozes its job: the attempt is not
// counted, and the job runs again after the snooze. (Enqueued before the
// workers start, as in TestJobDeadRequeuedCancelled.)
func TestJobSnoozed(t *testing.T) {
	f := newQueue(t)
	var snoozed atomic.Bool
	f.set(func(*deferred.Job) error {
		if !snoozed.Swap(true) {
			return deferred.Snooze(30 * time.Millisecond)
		}
		return nil
	})
	id, err := f.kind.Enqueue(t.Context(), "cy", 1)
	require.NoError(t, err)
	f.run(t)
	require.Equal(t, deferred.StateCompleted, f.wait(t, id).State)

	requireLines(t, []string{
		`job.enqueued enqueue key="cy"`,
		`job.claimed run key="cy" attempt=1`,
		`job.snoozed run key="cy" attempt=1 delay=30ms`,
		`job.claimed run key="cy" attempt=1`,
		`job.completed run key="cy" attempt=1 ok cause=none`,
	}, f.jobLines(t, id))
	f.requireNoQueueErrors(t)
}

// TestQueueKeySkipped: a Run without the handler of a key's head job leaves
// the key to other processes, and says so once, with the reason.
func TestQueueKeySkipped(t *testing.T) {
	f := newQueue(t)
	rec := &recorder{}
	other, err := deferred.New(f.db.Collection("jobs"), &deferred.Options{Observer: rec, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	_, err = deferred.Register(other, "other", func(context.Context, *deferred.Job, int) error { return nil })
	require.NoError(t, err)
	id, err := f.kind.Enqueue(t.Context(), "dee", 1)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = other.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	var skipped []observe.Event
	waitFor(t, func() bool {
		skipped = skipped[:0]
		for _, e := range rec.all() {
			if e.Kind == observe.QueueKeySkipped {
				skipped = append(skipped, e)
			}
		}
		return len(skipped) > 0
	})
	time.Sleep(300 * time.Millisecond) // three polls: no second report
	n := 0
	for _, e := range rec.all() {
		if e.Kind == observe.QueueKeySkipped {
			n++
		}
	}
	require.Equal(t, 1, n)
	e := skipped[0]
	require.Equal(t, "run", e.Op)
	require.Equal(t, "no_handler", e.Reason)
	require.Equal(t, "step", e.Name)
	require.Equal(t, `"dee"`, e.Key)
	require.Equal(t, id, e.ID)
}

// waitFor polls cond every 10ms for up to a minute.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, time.Minute, 10*time.Millisecond)
}

package deferred

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/internal/ended"
	"github.com/mongocas/mongocas/observe"
)

// The Queue's events (see Options.Observer): each function checks for an
// Observer before it builds anything.

// The operations of the job events, as observe.Event.Op.
const (
	opEnqueue = "enqueue"
	opRequeue = "requeue"
	opCancel  = "cancel"
	opRun     = "run"
)

// reasonNoHandler is QueueKeySkipped's Reason for a key whose head job has
// no handler in this process.
const reasonNoHandler = "no_handler"

// event returns an event of kind k reported by op, about the job id (nil
// for none) on key raw (zero for none) of handler name.
func (q *Queue) event(k observe.Kind, op string, id any, raw bson.RawValue, name string) observe.Event {
	e := observe.Event{Kind: k, Op: op, Database: q.jobs.Database().Name(), Collection: q.jobs.Name(), ID: id, Name: name}
	if raw.Type != 0 {
		e.Key = keyText(raw)
	}
	return e
}

// jobEvent reports an event of kind k about job, reported by op.
func (q *Queue) jobEvent(ctx context.Context, k observe.Kind, op string, job *Job) {
	if q.c.Observer == nil || job == nil {
		return
	}
	q.c.Observer.Observe(ctx, q.event(k, op, job.ID, job.Key, job.Name))
}

// failed reports what a worker (or Cancel's clean-up) could not return to
// anyone: step op failed with err, about key raw (zero for none).
func (q *Queue) failed(ctx context.Context, op string, raw bson.RawValue, err error) {
	if q.c.Observer == nil {
		return
	}
	e := q.event(observe.QueueError, op, nil, raw, "")
	e.Err = err
	q.c.Observer.Observe(ctx, e)
}

// warn reports a step op of the claim that failed, unless Run is stopping.
func (c *claim) warn(op string, err error) {
	if c.run.Err() == nil && c.q.c.Observer != nil {
		c.q.failed(c.run, op, c.key, err)
	}
}

// timed records how long the handler of the claim's current attempt ran,
// since start: call defers it.
func (c *claim) timed(start time.Time) { c.ran = c.q.local.Now().Sub(start) }

// claimed reports the claim of job for an attempt, with its age.
func (c *claim) claimed(job *Job) {
	c.ran = 0
	q := c.q
	if q.c.Observer == nil {
		return
	}
	e := q.event(observe.JobClaimed, opRun, job.ID, job.Key, job.Name)
	e.Attempt = job.Attempt
	if !job.EnqueuedAt.IsZero() && !job.StartedAt.IsZero() {
		e.Age = max(job.StartedAt.Sub(job.EnqueuedAt), 0)
	}
	q.c.Observer.Observe(c.run, e)
}

// recorded reports the outcome of job's attempt, which finish recorded:
// the job went to state to, and runs again after delay (retryable,
// snoozed).
func (c *claim) recorded(job *Job, o outcome, to State, delay time.Duration) {
	q := c.q
	if q.c.Observer == nil {
		return
	}
	var k observe.Kind
	switch {
	case o.snoozed:
		k, delay = observe.JobSnoozed, o.snooze
	case to == StateCompleted:
		k = observe.JobCompleted
	case to == StateDead:
		k = observe.JobDead
	default:
		k = observe.JobFailed
	}
	e := q.event(k, opRun, job.ID, job.Key, job.Name)
	e.Attempt, e.Elapsed, e.Err = job.Attempt, c.ran, o.err
	if k != observe.JobSnoozed {
		e.Outcome = ended.Outcome(o.err)
	}
	if k == observe.JobFailed || k == observe.JobSnoozed {
		e.Delay = max(delay, 0)
	}
	q.c.Observer.Observe(c.run, e)
}

// skipped reports that this worker leaves the key to other processes:
// this one has no handler for job, its head.
func (c *claim) skipped(job *Job) {
	q := c.q
	if q.c.Observer == nil {
		return
	}
	e := q.event(observe.QueueKeySkipped, opRun, job.ID, c.key, job.Name)
	e.Reason = reasonNoHandler
	q.c.Observer.Observe(c.run, e)
}

// interrupted reports that the worker lost its claim on the key while job
// ran: another worker takes the job over.
func (c *claim) interrupted(job *Job) {
	q := c.q
	if q.c.Observer == nil {
		return
	}
	e := q.event(observe.QueueError, opRun, job.ID, c.key, job.Name)
	e.Err = c.l.Err()
	q.c.Observer.Observe(c.run, e)
}

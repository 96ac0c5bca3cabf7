package deferred

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/internal/ended"
	"github.com/mongocas/mongocas/observe"
)

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

// report sends Options.Observer the event of kind k, reported by op, about
// job (nil: none) on key raw (zero: the job's), with the facts set adds;
// without an Observer it builds nothing.
func (q *Queue) report(ctx context.Context, k observe.Kind, op string, job *Job, raw bson.RawValue, set func(*observe.Event)) {
	if q.c.Observer == nil {
		return
	}
	e := observe.Event{Kind: k, Op: op, Database: q.jobs.Database().Name(), Collection: q.jobs.Name()}
	if job != nil {
		e.ID, e.Name = job.ID, job.Name
		if raw.Type == 0 {
			raw = job.Key
		}
	}
	if raw.Type != 0 {
		e.Key = keyText(raw)
	}
	if set != nil {
		set(&e)
	}
	q.c.Observer.Observe(ctx, e)
}

// jobEvent reports an event of kind k about job, reported by op.
func (q *Queue) jobEvent(ctx context.Context, k observe.Kind, op string, job *Job) {
	q.report(ctx, k, op, job, bson.RawValue{}, nil)
}

// failed reports what a worker (or Cancel's clean-up) could not return to
// anyone: step op failed with err, about key raw (zero for none).
func (q *Queue) failed(ctx context.Context, op string, raw bson.RawValue, err error) {
	q.report(ctx, observe.QueueError, op, nil, raw, func(e *observe.Event) { e.Err = err })
}

// warn reports a step op of the claim that failed with err (nil: nothing
// to report), unless Run is stopping.
func (h *hold) warn(op string, err error) {
	if err != nil && h.run.Err() == nil {
		h.q.failed(h.run, op, h.key, err)
	}
}

// timed records how long the handler of the claim's current attempt ran,
// since start: call defers it.
func (h *hold) timed(start time.Time) { h.ran = h.q.local.Now().Sub(start) }

// claimed reports the claim of job for an attempt, with its age.
func (h *hold) claimed(job *Job) {
	h.ran = 0
	h.q.report(h.run, observe.JobClaimed, opRun, job, bson.RawValue{}, func(e *observe.Event) {
		e.Attempt = job.Attempt
		if !job.EnqueuedAt.IsZero() && !job.StartedAt.IsZero() {
			e.Age = max(job.StartedAt.Sub(job.EnqueuedAt), 0)
		}
	})
}

// recorded reports the outcome of job's attempt: the job went to state to,
// and runs again after delay (retryable, snoozed).
func (h *hold) recorded(job *Job, o outcome, to State, delay time.Duration) {
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
	h.q.report(h.run, k, opRun, job, bson.RawValue{}, func(e *observe.Event) {
		e.Attempt, e.Elapsed, e.Err = job.Attempt, h.ran, o.err
		if k != observe.JobSnoozed {
			e.Outcome = ended.Outcome(o.err)
		}
		if k == observe.JobFailed || k == observe.JobSnoozed {
			e.Delay = max(delay, 0)
		}
	})
}

// skipped reports that this worker leaves the key to other processes:
// this one has no handler for job, its head.
func (h *hold) skipped(job *Job) {
	h.q.report(h.run, observe.QueueKeySkipped, opRun, job, h.key, func(e *observe.Event) { e.Reason = reasonNoHandler })
}

// interrupted reports that the worker lost its claim on the key while job
// ran: another worker takes the job over.
func (h *hold) interrupted(job *Job) {
	h.q.report(h.run, observe.QueueError, opRun, job, h.key, func(e *observe.Event) { e.Err = h.l.Err() })
}

// lostKey reports that the worker lost its claim on the key between jobs,
// none running: the event names the key and no job.
func (h *hold) lostKey() { h.interrupted(nil) }

package otelmongocas

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/observe"
)

// Attribute keys of the job, queue and idempotency metrics.
const (
	// EventKey is the event's kind ("job.completed", "queue.error",
	// "idempotency.replayed", "move.done", ...), on the mongocas.jobs,
	// mongocas.queue.errors, mongocas.idempotency.requests, mongocas.moves
	// and mongocas.move.duration metrics.
	EventKey = attribute.Key("mongocas.event")
	// JobNameKey is the name of a job's handler (its kind), on the job
	// metrics: a registered name, so of bounded cardinality.
	JobNameKey = attribute.Key("mongocas.job.name")
	// JobStateKey is a job state ("available", "retryable", "running",
	// "dead"), on the mongocas.queue.depth gauge.
	JobStateKey = attribute.Key("mongocas.job.state")
)

// DepthTimeout bounds the Counts query of each queue ObserveQueue reads at
// each collection of the metrics.
const DepthTimeout = 5 * time.Second

// jobInstruments are the instruments of the deferred and idempotency
// events.
type jobInstruments struct {
	meter    metric.Meter
	jobs     metric.Int64Counter
	age      metric.Float64Histogram
	duration metric.Float64Histogram
	errs     metric.Int64Counter
	requests metric.Int64Counter
	depth    metric.Int64ObservableGauge
	moves    metric.Int64Counter
	moveTime metric.Float64Histogram
}

func newJobInstruments(meter metric.Meter) (jobInstruments, error) {
	in := jobInstruments{meter: meter}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	in.jobs = counter("mongocas.jobs", "{job}", "The events of deferred jobs (enqueued, claimed, completed, failed, dead, snoozed, requeued, cancelled), by event, handler and outcome.")
	in.errs = counter("mongocas.queue.errors", "{error}", "What a deferred queue's workers could not return to anyone (queue.error, by step), and keys they left to other processes (queue.key_skipped).")
	in.requests = counter("mongocas.idempotency.requests", "{request}", "Requests with an idempotency key, by what became of them: completed, replayed, in progress, mismatch.")
	in.moves = counter("mongocas.moves", "{move}", "Moves between documents (package move), by event: debited (the value left the source), done (credited to the target), returned (given back to the source).")
	var err error
	in.age, err = meter.Float64Histogram("mongocas.job.age", metric.WithUnit("s"),
		metric.WithDescription("Age of a deferred job when a worker claims it: the time since it was enqueued, backoffs and snoozes included."),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600))
	errs = append(errs, err)
	in.duration, err = meter.Float64Histogram("mongocas.job.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a deferred job's handler ran, per attempt, by how the attempt ended."),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60))
	errs = append(errs, err)
	in.moveTime, err = meter.Float64Histogram("mongocas.move.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a move's value was in flight, from its debit to its settlement, by event (done, returned)."),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600))
	errs = append(errs, err)
	in.depth, err = meter.Int64ObservableGauge("mongocas.queue.depth", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs of a deferred queue by state (available, retryable, running, dead), read by a callback that Observer.ObserveQueue registers."))
	errs = append(errs, err)
	return in, errors.Join(errs...)
}

// observeJobs records the events of deferred, idempotency and move: a
// counter by event, the age of a claimed job, the run of a handler and the
// time a move was in flight, and a span event on the span in ctx (the
// caller's, for Enqueue, Requeue, Cancel, Keys.Do and Move). Their attributes are the event's own: the queue's or records'
// collection, whichever operation's context they come in.
func (o *Observer) observeJobs(ctx context.Context, span trace.Span, e *observe.Event) {
	set := dbAttrs(e)
	kind := EventKey.String(e.Kind.String())
	switch e.Kind {
	case observe.JobEnqueued, observe.JobClaimed, observe.JobCompleted, observe.JobFailed, observe.JobDead,
		observe.JobSnoozed, observe.JobRequeued, observe.JobCancelled:
		kv := append(set.ToSlice(), kind, JobNameKey.String(e.Name))
		if e.Outcome != "" {
			kv = append(kv, OutcomeKey.String(string(e.Outcome)))
		}
		jobSet := attribute.NewSet(kv...)
		o.jobs.jobs.Add(ctx, 1, metric.WithAttributeSet(jobSet))
		switch e.Kind {
		case observe.JobClaimed:
			o.jobs.age.Record(ctx, e.Age.Seconds(), metric.WithAttributeSet(with1(set, JobNameKey.String(e.Name))))
		case observe.JobCompleted, observe.JobFailed, observe.JobDead, observe.JobSnoozed:
			o.jobs.duration.Record(ctx, e.Elapsed.Seconds(), metric.WithAttributeSet(jobSet))
		default:
		}
		attrs := []attribute.KeyValue{JobNameKey.String(e.Name)}
		if e.Attempt > 0 {
			attrs = append(attrs, attribute.Int("mongocas.attempt", e.Attempt))
		}
		if e.Err != nil {
			attrs = append(attrs, cause(e.Err))
		}
		span.AddEvent(e.Kind.String(), trace.WithAttributes(attrs...))
	case observe.QueueError, observe.QueueKeySkipped:
		o.jobs.errs.Add(ctx, 1, metric.WithAttributeSet(with1(set, kind)))
		span.AddEvent(e.Kind.String(), trace.WithAttributes(cause(e.Err)))
	case observe.KeyCompleted, observe.KeyReplayed, observe.KeyInProgress, observe.KeyMismatch:
		o.jobs.requests.Add(ctx, 1, metric.WithAttributeSet(with1(set, kind)))
		span.AddEvent(e.Kind.String())
	case observe.MoveDebited, observe.MoveDone, observe.MoveReturned:
		moveSet := with1(set, kind)
		o.jobs.moves.Add(ctx, 1, metric.WithAttributeSet(moveSet))
		if e.Kind != observe.MoveDebited {
			o.jobs.moveTime.Record(ctx, e.Age.Seconds(), metric.WithAttributeSet(moveSet))
		}
		span.AddEvent(e.Kind.String(), trace.WithAttributes(attribute.Int64("mongocas.move.amount", e.Amount)))
	default:
	}
}

// depthStates are the states the mongocas.queue.depth gauge reports: the
// jobs waiting (available, retryable), running, and dead (waiting for
// someone to requeue or cancel them).
var depthStates = []deferred.State{deferred.StateAvailable, deferred.StateRetryable, deferred.StateRunning, deferred.StateDead}

// ObserveQueue registers a callback that reports the depth of q, the jobs
// in each of the states available, retryable, running and dead, as the
// mongocas.queue.depth gauge, with db.system.name, db.namespace,
// db.collection.name (q's jobs collection) and mongocas.job.state. The
// callback runs at each collection of the metrics (a Counts aggregation,
// bounded by DepthTimeout; a failure is returned to the SDK, which reports
// it to its error handler, and the gauge has no points that time). Call it
// once per queue, in one process per queue is enough; Unregister the
// returned Registration to stop.
func (o *Observer) ObserveQueue(q *deferred.Queue) (metric.Registration, error) {
	if q == nil {
		return nil, errors.New("otelmongocas: ObserveQueue: nil queue")
	}
	jobs := q.Jobs()
	base := []attribute.KeyValue{semconv.DBSystemNameMongoDB, semconv.DBNamespace(jobs.Database().Name()), semconv.DBCollectionName(jobs.Name())}
	sets := make([]attribute.Set, len(depthStates))
	for i, s := range depthStates {
		sets[i] = attribute.NewSet(append(slices.Clip(base), JobStateKey.String(string(s)))...)
	}
	return o.jobs.meter.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, DepthTimeout)
		defer cancel()
		counts, err := q.Counts(ctx)
		if err != nil {
			return fmt.Errorf("otelmongocas: queue depth of %s: %w", jobs.Name(), err)
		}
		for i, s := range depthStates {
			obs.ObserveInt64(o.jobs.depth, counts[s], metric.WithAttributeSet(sets[i]))
		}
		return nil
	}, o.jobs.depth)
}

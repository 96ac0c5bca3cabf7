package otelmongocas

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/semconv/v1.41.0/dbconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/mongocas/mongocas/observe"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/mongocas/mongocas/otelmongocas"

// Attribute keys of mongocas's own, beside the database semantic
// conventions.
const (
	// OutcomeKey is the operation's observe.Outcome ("ok", "conflict",
	// "unknown_outcome", ...), on spans.
	OutcomeKey = attribute.Key("mongocas.outcome")
	// AttemptsKey is the number of attempts of an operation that loops
	// (versioned Modify), on spans.
	AttemptsKey = attribute.Key("mongocas.attempts")
	// SettlementKey is how an ambiguous write was settled ("landed",
	// "resent", "not_landed", "unknown"), on the mongocas.writes.ambiguous
	// metric and the span event.
	SettlementKey = attribute.Key("mongocas.settlement")
	// ReasonKey is why a lease was lost ("expired", "taken_over",
	// "cleared", "unread"), on the mongocas.lease.lost metric.
	ReasonKey = attribute.Key("mongocas.lease.reason")
	// LeaseEndKey says how a lease's hold ended ("released" or "lost"), on
	// the mongocas.lease.hold.duration metric.
	LeaseEndKey = attribute.Key("mongocas.lease.end")
)

// Options configures New. A nil *Options means the global providers.
type Options struct {
	// TracerProvider makes the tracer of the spans. Nil means
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the meter of the metrics. Nil means
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Observer is an observe.Observer that turns mongocas's events into
// OpenTelemetry spans and metrics (see the package documentation). Make it
// with New; it is safe for concurrent use.
type Observer struct {
	tracer trace.Tracer

	duration   dbconv.ClientOperationDuration
	conflicts  metric.Int64Counter
	retries    metric.Int64Counter
	refusals   metric.Int64Counter
	ambiguous  metric.Int64Counter
	unknown    metric.Int64Counter
	attempts   metric.Int64Histogram
	leaseWait  metric.Float64Histogram
	leaseHold  metric.Float64Histogram
	leasesLost metric.Int64Counter
	jobs       jobInstruments
}

var _ observe.Observer = (*Observer)(nil)

// New returns an Observer that reports to the providers of opts. It fails
// only if the meter refuses to make an instrument.
func New(opts *Options) (*Observer, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	meter := o.MeterProvider.Meter(ScopeName)
	ob := &Observer{tracer: o.TracerProvider.Tracer(ScopeName)}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	var err error
	ob.duration, err = dbconv.NewClientOperationDuration(meter,
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10))
	errs = append(errs, err)
	ob.conflicts = counter("mongocas.conflicts", "{conflict}", "Version conflicts: a write found another version than the one it expected.")
	ob.retries = counter("mongocas.retries", "{retry}", "Retries after a retryable failure (a conflict, a transient error, a held lease).")
	ob.refusals = counter("mongocas.retry.budget_refusals", "{retry}", "Retries the retry budget refused.")
	ob.ambiguous = counter("mongocas.writes.ambiguous", "{write}", "Writes whose outcome was ambiguous (a lost reply, a timeout), by how they were settled.")
	ob.unknown = counter("mongocas.unknown_outcomes", "{operation}", "Operations that ended with an outcome that could not be settled (store.ErrUnknownOutcome).")
	ob.leasesLost = counter("mongocas.lease.lost", "{lease}", "Leases lost by their holder, by reason.")
	ob.attempts, err = meter.Int64Histogram("mongocas.modify.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts (reads of the document) per versioned Modify call."),
		metric.WithExplicitBucketBoundaries(1, 2, 3, 4, 5, 7, 10, 15, 20))
	errs = append(errs, err)
	ob.leaseWait, err = meter.Float64Histogram("mongocas.lease.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a call that acquires a lease to the claim that got it, waiting included."),
		metric.WithExplicitBucketBoundaries(0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300))
	errs = append(errs, err)
	ob.leaseHold, err = meter.Float64Histogram("mongocas.lease.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a lease was held, from its claim to its release or loss."),
		metric.WithExplicitBucketBoundaries(0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800))
	errs = append(errs, err)
	ob.jobs, err = newJobInstruments(meter)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return ob, nil
}

// scope is what Start keeps in an operation's context: its attributes, for
// the metrics of events that carry none (those of retry.Do and
// store.ServerClock).
type scope struct {
	attrs attribute.Set
}

type scopeKey struct{}

// attrs returns the metric attributes of an event: the operation's that
// ctx carries, else the event's own.
func attrs(ctx context.Context, e *observe.Event) attribute.Set {
	if s, ok := ctx.Value(scopeKey{}).(*scope); ok {
		return s.attrs
	}
	return dbAttrs(e)
}

func dbAttrs(e *observe.Event) attribute.Set {
	kv := []attribute.KeyValue{semconv.DBSystemNameMongoDB}
	if e.Database != "" {
		kv = append(kv, semconv.DBNamespace(e.Database))
	}
	if e.Collection != "" {
		kv = append(kv, semconv.DBCollectionName(e.Collection))
	}
	if e.Op != "" {
		kv = append(kv, semconv.DBOperationName(e.Op))
	}
	return attribute.NewSet(kv...)
}

// Start starts the operation's span, a child of any span in ctx, named
// "<operation> <collection>" (such as "modify accounts"), of kind client,
// with the database semantic-convention attributes, and returns ctx with
// it.
func (o *Observer) Start(ctx context.Context, e observe.Event) context.Context {
	set := dbAttrs(&e)
	// The span ends in Observe, at the operation's OpEnd, which every
	// operation that started reports.
	ctx, _ = o.tracer.Start(ctx, e.Op+" "+e.Collection, //nolint:spancheck // ended by end, at OpEnd
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(set.ToSlice()...))
	return context.WithValue(ctx, scopeKey{}, &scope{attrs: set})
}

// Observe records e: OpEnd ends the span and records the operation's
// duration; the other events become span events and metrics.
func (o *Observer) Observe(ctx context.Context, e observe.Event) {
	span := trace.SpanFromContext(ctx)
	set := attrs(ctx, &e)
	with := metric.WithAttributeSet(set)
	switch e.Kind {
	case observe.OpEnd:
		o.end(ctx, span, set, &e)
		return
	case observe.Conflict:
		o.conflicts.Add(ctx, 1, with)
		span.AddEvent(e.Kind.String(), trace.WithAttributes(
			attribute.Int64("mongocas.version.expected", e.Expected), attribute.Int64("mongocas.version.current", e.Current)))
	case observe.Retry:
		o.retries.Add(ctx, 1, with)
		span.AddEvent(e.Kind.String(), trace.WithAttributes(
			attribute.Int("mongocas.attempt", e.Attempt), attribute.Float64("mongocas.retry.delay", e.Delay.Seconds()), cause(e.Err)))
	case observe.BudgetRefused:
		o.refusals.Add(ctx, 1, with)
		span.AddEvent(e.Kind.String(), trace.WithAttributes(attribute.Int("mongocas.attempt", e.Attempt), cause(e.Err)))
	case observe.Ambiguous:
		span.AddEvent(e.Kind.String(), trace.WithAttributes(cause(e.Err)))
	case observe.Settled:
		how := SettlementKey.String(e.Settlement.String())
		o.ambiguous.Add(ctx, 1, metric.WithAttributeSet(with1(set, how)))
		span.AddEvent(e.Kind.String(), trace.WithAttributes(how))
	case observe.LeaseAcquired:
		o.leaseWait.Record(ctx, e.Wait.Seconds(), with)
		span.AddEvent(e.Kind.String(), trace.WithAttributes(attribute.Int64("mongocas.lease.epoch", e.Epoch)))
	case observe.LeaseRenewed, observe.LeaseRenewFailed:
		span.AddEvent(e.Kind.String(), trace.WithAttributes(attribute.Int64("mongocas.lease.epoch", e.Epoch)))
	case observe.LeaseReleased:
		o.leaseHold.Record(ctx, e.Held.Seconds(), metric.WithAttributeSet(with1(set, LeaseEndKey.String("released"))))
		span.AddEvent(e.Kind.String(), trace.WithAttributes(attribute.Int64("mongocas.lease.epoch", e.Epoch)))
	case observe.LeaseLost:
		o.leaseHold.Record(ctx, e.Held.Seconds(), metric.WithAttributeSet(with1(set, LeaseEndKey.String("lost"))))
		o.leasesLost.Add(ctx, 1, metric.WithAttributeSet(with1(set, ReasonKey.String(e.Reason))))
		span.AddEvent(e.Kind.String(), trace.WithAttributes(
			attribute.Int64("mongocas.lease.epoch", e.Epoch), ReasonKey.String(e.Reason), attribute.String("mongocas.lease.holder", e.Holder)))
	case observe.LeaseHeld:
		span.AddEvent(e.Kind.String(), trace.WithAttributes(
			attribute.String("mongocas.lease.holder", e.Holder), attribute.Int64("mongocas.lease.epoch", e.Epoch),
			attribute.Float64("mongocas.lease.time_left", e.TimeLeft.Seconds())))
	case observe.ClockSync:
		span.AddEvent(e.Kind.String(), trace.WithAttributes(
			attribute.Float64("mongocas.clock.bound", e.Bound.Seconds()), attribute.Float64("mongocas.clock.rtt", e.RTT.Seconds())))
	default:
		o.observeJobs(ctx, span, &e)
	}
}

// end ends an operation: its span (with the outcome, and an error status
// for an outcome that failed), its duration, its attempts, and an unknown
// outcome.
func (o *Observer) end(ctx context.Context, span trace.Span, set attribute.Set, e *observe.Event) {
	dur := set
	if e.Outcome != observe.OK {
		dur = with1(set, semconv.ErrorTypeKey.String(string(e.Outcome)))
		span.SetAttributes(semconv.ErrorTypeKey.String(string(e.Outcome)))
	}
	o.duration.RecordSet(ctx, e.Elapsed.Seconds(), dur)
	if e.Op == "modify" && e.Attempt > 0 {
		o.attempts.Record(ctx, int64(e.Attempt), metric.WithAttributeSet(set))
	}
	if e.Outcome == observe.OutcomeUnknown {
		o.unknown.Add(ctx, 1, metric.WithAttributeSet(set))
	}
	span.SetAttributes(OutcomeKey.String(string(e.Outcome)))
	if e.Attempt > 0 {
		span.SetAttributes(AttemptsKey.Int(e.Attempt))
	}
	if e.Outcome.Failed() && e.Err != nil {
		span.RecordError(e.Err)
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End()
}

// with1 is set with kv added.
func with1(set attribute.Set, kv attribute.KeyValue) attribute.Set {
	return attribute.NewSet(append(set.ToSlice(), kv)...)
}

// cause is the attribute naming an event's error by its type (error.type),
// such as "*versioned.ConflictError".
func cause(err error) attribute.KeyValue {
	if err == nil {
		return semconv.ErrorTypeOther
	}
	return semconv.ErrorType(err)
}

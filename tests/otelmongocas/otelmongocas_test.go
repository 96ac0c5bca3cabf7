// Package otelmongocas_test drives the OpenTelemetry adapter through a real
// server and asserts the spans (SDK in-memory exporter) and the metric values
// (SDK manual reader) it produces. It lives in the tests module, so that the
// adapter's own module needs neither the SDK nor a server.
package otelmongocas_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/otelmongocas"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

// TestMoves: a move that is done and one that is returned (its target is
// missing): the moves counter by event, the time in flight of each
// settlement, and the debit as an event of the caller's span.
func TestMoves(t *testing.T) {
	tm := newTelemetry(t)
	db := mongotest.New(t)
	ctx := t.Context()
	q, err := deferred.New(db.Collection("jobs"), &deferred.Options{PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	accounts := db.Collection("accounts")
	_, err = accounts.InsertMany(ctx, []any{
		account{ID: "ana", Balance: 100, Version: 1}, account{ID: "ben", Version: 1},
	})
	require.NoError(t, err)
	m, err := move.New(ctx, q, accounts, &move.Options{Field: "balance", Observer: tm.obs})
	require.NoError(t, err)

	tracer := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tm.spans)).Tracer("test")
	rctx, request := tracer.Start(ctx, "POST /transfers")
	done, err := m.Move(rctx, "ana", "ben", 30, nil)
	require.NoError(t, err)
	returned, err := m.Move(rctx, "ana", "nobody", 5, nil)
	require.NoError(t, err)
	request.End()
	require.Equal(t, []string{"move.debited", "move.debited"}, filter(eventNames(tm.span(t, "POST /transfers")), "move."))

	runCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = q.Run(runCtx) })
	for id, want := range map[bson.ObjectID]move.Status{done: move.Done, returned: move.Returned} {
		deadline := time.Now().Add(time.Minute)
		for {
			st, err := m.Status(ctx, "ana", id)
			require.NoError(t, err)
			if st == want {
				break
			}
			require.True(t, time.Now().Before(deadline), "move %s: %s after a minute", id.Hex(), st)
			time.Sleep(10 * time.Millisecond)
		}
	}
	stop()
	wg.Wait()

	ms := tm.metrics(t)
	moves := func(event string) int64 {
		return sum(t, ms, "mongocas.moves", map[string]string{"db.collection.name": "accounts", "mongocas.event": event})
	}
	require.Equal(t, int64(2), moves("move.debited"))
	require.Equal(t, int64(1), moves("move.done"))
	require.Equal(t, int64(1), moves("move.returned"))
	for _, event := range []string{"move.done", "move.returned"} {
		n, total := hist[float64](t, ms, "mongocas.move.duration", map[string]string{"mongocas.event": event, "db.operation.name": "relay"})
		require.Equal(t, uint64(1), n, event)
		require.Positive(t, total, event)
		require.Less(t, total, 60.0, event)
	}
}

// filter returns the names that start with prefix.
func filter(names []string, prefix string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}

type account struct {
	ID      string `bson:"_id"`
	Balance int64  `bson:"balance"`
	Version int64  `bson:"version"`
}

// telemetry is an adapter on an SDK that keeps its spans in memory and
// whose metrics the test collects when it wants.
type telemetry struct {
	obs    *otelmongocas.Observer
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
}

func newTelemetry(t *testing.T) *telemetry {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	obs, err := otelmongocas.New(&otelmongocas.Options{TracerProvider: tp, MeterProvider: mp})
	require.NoError(t, err)
	return &telemetry{obs: obs, spans: spans, reader: reader}
}

// span returns the only ended span named name.
func (tm *telemetry) span(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range tm.spans.GetSpans() {
		if s.Name == name {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "spans named %q", name)
	return found[0]
}

func attrsOf(kvs []attribute.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

func eventNames(s tracetest.SpanStub) []string {
	names := make([]string, 0, len(s.Events))
	for _, e := range s.Events {
		names = append(names, e.Name)
	}
	return names
}

// eventNamed returns the only event of s named name.
func eventNamed(t *testing.T, s tracetest.SpanStub, name string) sdktrace.Event {
	t.Helper()
	var found []sdktrace.Event
	for _, e := range s.Events {
		if e.Name == name {
			found = append(found, e)
		}
	}
	require.Len(t, found, 1, "events %q of span %q", name, s.Name)
	return found[0]
}

// metrics collects the metrics recorded so far, by name.
func (tm *telemetry) metrics(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tm.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, otelmongocas.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// has reports whether the attribute set holds every key and value of want.
func has(set attribute.Set, want map[string]string) bool {
	for k, v := range want {
		got, ok := set.Value(attribute.Key(k))
		if !ok || got.String() != v {
			return false
		}
	}
	return true
}

// sum returns the value of the counter name for the points whose attributes
// hold want.
func sum(t *testing.T, ms map[string]metricdata.Aggregation, name string, want map[string]string) int64 {
	t.Helper()
	data, ok := ms[name]
	require.True(t, ok, "metric %s recorded", name)
	s, ok := data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is an int64 sum: %T", name, data)
	require.True(t, s.IsMonotonic)
	var n int64
	for _, p := range s.DataPoints {
		if has(p.Attributes, want) {
			n += p.Value
		}
	}
	return n
}

// hist returns the count and sum of the histogram name for the points
// whose attributes hold want.
func hist[N int64 | float64](t *testing.T, ms map[string]metricdata.Aggregation, name string, want map[string]string) (uint64, N) {
	t.Helper()
	data, ok := ms[name]
	require.True(t, ok, "metric %s recorded", name)
	h, ok := data.(metricdata.Histogram[N])
	require.True(t, ok, "%s: %T", name, data)
	var count uint64
	var total N
	for _, p := range h.DataPoints {
		if has(p.Attributes, want) {
			count += p.Count
			total += p.Sum
		}
	}
	return count, total
}

// TestVersioned: a Modify that meets one conflict, a Get of a missing
// document, and an insert whose outcome is unknown; their spans and metrics.
func TestVersioned(t *testing.T) {
	tm := newTelemetry(t)
	db := mongotest.New(t)
	ctx := t.Context()
	fc := db.Faulty(t, nil)
	repo, err := versioned.New[account](fc.Collection("accounts"), &versioned.Options{Observer: tm.obs})
	require.NoError(t, err)
	other, err := versioned.New[account](db.Collection("accounts"), nil)
	require.NoError(t, err)

	a := &account{ID: "a", Balance: 1}
	require.NoError(t, repo.Insert(ctx, a))
	calls := 0
	_, err = repo.Modify(ctx, "a", func(x *account) error {
		if calls++; calls == 1 {
			_, err := other.Guarded(ctx, "a", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
			require.NoError(t, err)
		}
		x.Balance *= 10
		return nil
	})
	require.NoError(t, err)
	_, err = repo.Get(ctx, "nobody")
	require.ErrorIs(t, err, versioned.ErrNotFound)
	fc.HoldNext(mongotest.Writes("accounts"))
	require.ErrorIs(t, repo.Insert(ctx, &account{ID: "u"}), versioned.ErrUnknownOutcome)

	common := map[string]any{
		"db.system.name":     "mongodb",
		"db.namespace":       db.Name(),
		"db.collection.name": "accounts",
	}
	modify := tm.span(t, "modify accounts")
	require.Equal(t, trace.SpanKindClient, modify.SpanKind)
	got := attrsOf(modify.Attributes)
	for k, v := range common {
		require.Equal(t, v, got[k], k)
	}
	require.Equal(t, "modify", got["db.operation.name"])
	require.Equal(t, "ok", got["mongocas.outcome"])
	require.Equal(t, int64(2), got["mongocas.attempts"])
	require.NotContains(t, got, "error.type")
	require.Equal(t, codes.Unset, modify.Status.Code)
	require.Equal(t, []string{"conflict", "retry"}, eventNames(modify))
	conflict := attrsOf(modify.Events[0].Attributes)
	// A document's first conflict: its write, an updateOne, does not
	// return the document, and the next attempt reads it: -1.
	require.Equal(t, int64(-1), conflict["mongocas.version.current"])
	require.Equal(t, "*versioned.ConflictError", attrsOf(modify.Events[1].Attributes)["error.type"])

	get := tm.span(t, "get accounts")
	got = attrsOf(get.Attributes)
	require.Equal(t, "not_found", got["error.type"])
	require.Equal(t, codes.Unset, get.Status.Code, "a missing document is an answer, not an error")

	var inserts []tracetest.SpanStub
	for _, s := range tm.spans.GetSpans() {
		if s.Name == "insert accounts" {
			inserts = append(inserts, s)
		}
	}
	require.Len(t, inserts, 2)
	unknown := inserts[1]
	require.Equal(t, "unknown_outcome", attrsOf(unknown.Attributes)["error.type"])
	require.Equal(t, codes.Error, unknown.Status.Code)
	require.Equal(t, []string{"write.ambiguous", "write.settled", "exception"}, eventNames(unknown))
	require.Equal(t, "unknown", attrsOf(unknown.Events[1].Attributes)["mongocas.settlement"])

	ms := tm.metrics(t)
	mod := map[string]string{"db.collection.name": "accounts", "db.operation.name": "modify", "db.system.name": "mongodb"}
	require.Equal(t, int64(1), sum(t, ms, "mongocas.conflicts", mod))
	require.Equal(t, int64(1), sum(t, ms, "mongocas.retries", mod), "the retry counts for the operation it ran in")
	n, total := hist[int64](t, ms, "mongocas.modify.attempts", mod)
	require.Equal(t, uint64(1), n)
	require.Equal(t, int64(2), total)
	ins := map[string]string{"db.collection.name": "accounts", "db.operation.name": "insert"}
	require.Equal(t, int64(1), sum(t, ms, "mongocas.unknown_outcomes", ins))
	require.Equal(t, int64(1), sum(t, ms, "mongocas.writes.ambiguous", map[string]string{"db.operation.name": "insert", "mongocas.settlement": "unknown"}))
	n, _ = hist[float64](t, ms, "db.client.operation.duration", ins)
	require.Equal(t, uint64(2), n)
	n, _ = hist[float64](t, ms, "db.client.operation.duration", map[string]string{"db.operation.name": "insert", "error.type": "unknown_outcome"})
	require.Equal(t, uint64(1), n)
	n, _ = hist[float64](t, ms, "db.client.operation.duration", map[string]string{"db.operation.name": "get", "error.type": "not_found"})
	require.Equal(t, uint64(1), n)
}

// TestLease: a Do (its release a child of its span), a claim that finds the
// lease held, and a lease lost because someone cleared its record.
func TestLease(t *testing.T) {
	tm := newTelemetry(t)
	db := mongotest.New(t)
	ctx := t.Context()
	users := db.Collection("users")
	id := bson.NewObjectID()
	_, err := users.InsertOne(ctx, bson.D{{Key: "_id", Value: id}})
	require.NoError(t, err)
	a, err := lease.New(users, &lease.Options{TTL: time.Minute, Owner: "a", Observer: tm.obs})
	require.NoError(t, err)
	b, err := lease.New(users, &lease.Options{TTL: time.Minute, Owner: "b", Observer: tm.obs})
	require.NoError(t, err)

	require.NoError(t, a.Do(ctx, id, func(context.Context, *lease.Lease) error { return nil }))
	do, release := tm.span(t, "do users"), tm.span(t, "release users")
	require.Equal(t, do.SpanContext.SpanID(), release.Parent.SpanID(), "Do's release is its child")
	require.Contains(t, eventNames(do), "lease.acquired")
	require.Contains(t, eventNames(do), "lease.released", "the lease's end comes in the context it was acquired in")

	l, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, id)
	require.ErrorIs(t, err, lease.ErrHeld)
	_, err = users.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$unset", Value: bson.D{{Key: "_lease.owner", Value: ""}}}})
	require.NoError(t, err)
	require.ErrorIs(t, l.Renew(ctx), lease.ErrLost)

	var held tracetest.SpanStub
	for _, s := range tm.spans.GetSpans() {
		if s.Name == "try_acquire users" && attrsOf(s.Attributes)["error.type"] == "held" {
			held = s
		}
	}
	require.Equal(t, "a", attrsOf(eventNamed(t, held, "lease.held").Attributes)["mongocas.lease.holder"])
	renew := tm.span(t, "renew users")
	require.Equal(t, "lost", attrsOf(renew.Attributes)["error.type"])
	require.Equal(t, codes.Error, renew.Status.Code)

	ms := tm.metrics(t)
	coll := map[string]string{"db.collection.name": "users"}
	n, _ := hist[float64](t, ms, "mongocas.lease.wait.duration", coll)
	require.Equal(t, uint64(2), n, "Do's claim and TryAcquire's")
	n, _ = hist[float64](t, ms, "mongocas.lease.hold.duration", map[string]string{"db.collection.name": "users", "mongocas.lease.end": "released"})
	require.Equal(t, uint64(1), n)
	n, _ = hist[float64](t, ms, "mongocas.lease.hold.duration", map[string]string{"db.collection.name": "users", "mongocas.lease.end": "lost"})
	require.Equal(t, uint64(1), n)
	require.Equal(t, int64(1), sum(t, ms, "mongocas.lease.lost", map[string]string{"db.collection.name": "users", "mongocas.lease.reason": "cleared"}))
	require.Zero(t, sum(t, ms, "mongocas.lease.lost", map[string]string{"mongocas.lease.reason": "taken_over"}))
}

// gauge returns the value of the int64 gauge name at the point whose
// attributes hold want, and whether there is one.
func gauge(t *testing.T, ms map[string]metricdata.Aggregation, name string, want map[string]string) (int64, bool) {
	t.Helper()
	data, ok := ms[name]
	if !ok {
		return 0, false
	}
	g, ok := data.(metricdata.Gauge[int64])
	require.True(t, ok, "%s is an int64 gauge: %T", name, data)
	for _, p := range g.DataPoints {
		if has(p.Attributes, want) {
			return p.Value, true
		}
	}
	return 0, false
}

// TestDeferredQueue: the depth of a queue (the gauge ObserveQueue feeds from
// Queue.Counts) before and after its workers ran; the job events by event,
// handler and outcome; the age of each job when claimed; the enqueue's
// span event on the caller's span.
func TestDeferredQueue(t *testing.T) {
	tm := newTelemetry(t)
	db := mongotest.New(t)
	ctx := t.Context()
	q, err := deferred.New(db.Collection("jobs"), &deferred.Options{
		Observer: tm.obs, PollInterval: 100 * time.Millisecond,
		Backoff: retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond},
	})
	require.NoError(t, err)
	kind, err := deferred.Register(q, "credit", func(_ context.Context, job *deferred.Job, n int) error {
		if n == 1 && job.Attempt == 1 {
			return errors.New("flaky")
		}
		return nil
	})
	require.NoError(t, err)
	reg, err := tm.obs.ObserveQueue(q)
	require.NoError(t, err)
	defer func() { require.NoError(t, reg.Unregister()) }()

	tracer := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tm.spans)).Tracer("test")
	rctx, request := tracer.Start(ctx, "POST /credits")
	ids := make([]bson.ObjectID, 3)
	for i := range ids {
		ids[i], err = kind.Enqueue(rctx, fmt.Sprintf("acct-%d", i), i)
		require.NoError(t, err)
	}
	request.End()
	enqueued := 0
	for _, name := range eventNames(tm.span(t, "POST /credits")) {
		if name == "job.enqueued" {
			enqueued++
		}
	}
	require.Equal(t, 3, enqueued, "an enqueue is an event of the caller's span (beside the queue clock's first sync)")

	jobs := map[string]string{"db.namespace": db.Name(), "db.collection.name": "jobs"}
	depth := func(state string) int64 {
		t.Helper()
		v, ok := gauge(t, tm.metrics(t), "mongocas.queue.depth", map[string]string{"db.collection.name": "jobs", "mongocas.job.state": state})
		require.True(t, ok, "depth of %s reported", state)
		return v
	}
	require.Equal(t, int64(3), depth("available"))
	require.Zero(t, depth("dead"))

	runCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = q.Run(runCtx) })
	for _, id := range ids {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		job, err := q.Wait(wctx, id, 10*time.Millisecond)
		cancel()
		require.NoError(t, err)
		require.Equal(t, deferred.StateCompleted, job.State)
	}
	stop()
	wg.Wait()
	require.Zero(t, depth("available"))
	require.Zero(t, depth("retryable"))

	ms := tm.metrics(t)
	ev := func(event string, more map[string]string) int64 {
		want := map[string]string{"mongocas.event": event, "mongocas.job.name": "credit"}
		maps.Copy(want, jobs)
		maps.Copy(want, more)
		return sum(t, ms, "mongocas.jobs", want)
	}
	require.Equal(t, int64(3), ev("job.enqueued", map[string]string{"db.operation.name": "enqueue"}))
	require.Equal(t, int64(4), ev("job.claimed", map[string]string{"db.operation.name": "run"}))
	require.Equal(t, int64(1), ev("job.failed", map[string]string{"mongocas.outcome": "error"}))
	require.Equal(t, int64(3), ev("job.completed", map[string]string{"mongocas.outcome": "ok"}))
	n, _ := hist[float64](t, ms, "mongocas.job.age", map[string]string{"mongocas.job.name": "credit"})
	require.Equal(t, uint64(4), n, "an age per claim")
	n, _ = hist[float64](t, ms, "mongocas.job.duration", map[string]string{"mongocas.event": "job.failed"})
	require.Equal(t, uint64(1), n)
	_, ok := ms["mongocas.queue.errors"]
	require.False(t, ok, "no queue errors")
}

// TestIdempotencyRequests: the requests of a key by what became of them,
// and the completion as an event of the claim's span.
func TestIdempotencyRequests(t *testing.T) {
	tm := newTelemetry(t)
	db := mongotest.New(t)
	ctx := t.Context()
	keys, err := idempotency.New(db.Collection("keys"), &idempotency.Options{Observer: tm.obs})
	require.NoError(t, err)
	ok := func(context.Context, *idempotency.Call) (idempotency.Result, error) {
		return idempotency.Result{Status: 201}, nil
	}
	_, err = keys.Do(ctx, "k1", []byte("a"), ok)
	require.NoError(t, err)
	_, err = keys.Do(ctx, "k1", []byte("a"), ok)
	require.NoError(t, err)
	_, err = keys.Do(ctx, "k1", []byte("b"), ok)
	require.ErrorIs(t, err, idempotency.ErrMismatch)

	require.Contains(t, eventNames(tm.span(t, "do keys")), "idempotency.completed", "the completion is an event of the claim's span")
	ms := tm.metrics(t)
	req := func(event string) int64 {
		return sum(t, ms, "mongocas.idempotency.requests", map[string]string{"db.collection.name": "keys", "mongocas.event": event})
	}
	require.Equal(t, int64(1), req("idempotency.completed"))
	require.Equal(t, int64(1), req("idempotency.replayed"))
	require.Equal(t, int64(1), req("idempotency.mismatch"))
	require.Zero(t, req("idempotency.in_progress"))
}

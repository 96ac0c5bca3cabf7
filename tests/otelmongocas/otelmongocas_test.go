// Package otelmongocas_test drives the OpenTelemetry adapter through a real
// server and asserts the spans (SDK in-memory exporter) and the metric values
// (SDK manual reader) it produces. It lives in the tests module, so that the
// adapter's own module needs neither the SDK nor a server.
package otelmongocas_test

import (
	"context"
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

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/otelmongocas"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

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
		if !ok || got.Emit() != v {
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
	// Where the server runs update pipelines, Modify's write returns the
	// document it found, so the conflict knows the current version (the
	// other write's); elsewhere the next attempt reads it: -1.
	current := int64(-1)
	if db.Server.Caps.UpdatePipelines {
		current = a.Version + 1
	}
	require.Equal(t, current, conflict["mongocas.version.current"])
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

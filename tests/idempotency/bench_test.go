package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

// BenchmarkHandler times a POST through the middleware beside the bare
// handler in the same run. The handler does what a real one does at least
// once: one write (an insertOne of the order). "first" is a request with a
// new key each time (the record's read, its insert with the claim, and the
// result stored with the release around the handler: three round trips);
// "replay" is a retry of a completed one (one round trip: the read; the
// handler does not run). roundtrips/op counts the commands sent, so the
// overhead reads in round trips on any server.
//
//	go test -run='^$' -bench=Handler -benchmem -benchtime=200x ./tests/idempotency
func BenchmarkHandler(b *testing.B) {
	db := mongotest.New(b)
	var commands atomic.Int64
	opts := options.Client().ApplyURI(db.Server.URI).SetMonitor(&event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			if e.CommandName != "hello" && e.CommandName != "isMaster" {
				commands.Add(1)
			}
		},
	})
	client, err := mongo.Connect(opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	mdb := client.Database(db.Name())
	orders := mdb.Collection("orders")
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, err := orders.InsertOne(r.Context(), bson.D{{Key: "item", Value: "mug"}})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"order":%q}`, res.InsertedID)
	})
	clock := store.NewServerClock(store.HelloSampler(client), nil)
	if _, err := clock.Now(context.Background()); err != nil { // first sync outside the timing
		b.Fatal(err)
	}
	k, err := idempotency.New(mdb.Collection("keys"), &idempotency.Options{TTL: time.Minute, Owner: "bench", Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	wrapped, err := k.Handler(bare, nil)
	if err != nil {
		b.Fatal(err)
	}
	serve := func(b *testing.B, h http.Handler, key string) {
		b.Helper()
		req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/orders", strings.NewReader(`{"item":"mug"}`))
		if key != "" {
			req.Header.Set(idempotency.HeaderKey, key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	keys := mdb.Collection("keys")
	// forget deletes a first request's record outside the timing:
	// FerretDB v1 scans the whole collection for a write filtered on more
	// than a bare _id, so a growing collection would time its scan.
	forget := func(b *testing.B, key string) {
		b.Helper()
		b.StopTimer()
		n := commands.Load()
		if _, err := keys.DeleteOne(context.Background(), bson.D{{Key: "_id", Value: key}}); err != nil {
			b.Fatal(err)
		}
		commands.Store(n)
		b.StartTimer()
	}
	run := func(name string, h http.Handler, key func(i int) string, after func(b *testing.B, key string)) {
		b.Run(name, func(b *testing.B) {
			serve(b, h, key(-1)) // warm up: the mode probe, the replayed key
			commands.Store(0)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				serve(b, h, key(i))
				if after != nil {
					after(b, key(i))
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(commands.Load())/float64(b.N), "roundtrips/op")
		})
	}
	run("bare", bare, func(int) string { return "" }, nil)
	run("first", wrapped, func(i int) string { return fmt.Sprintf("first-%d", i) }, forget)
	run("replay", wrapped, func(int) string { return "replayed" }, nil)
}

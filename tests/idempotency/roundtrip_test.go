package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
)

// TestRoundTripsPerRequest counts, with a command monitor, what the
// middleware sends around a handler that makes one insert of its own: a
// first request sends 3 commands more than the handler (the record's read,
// its insert with the claim in it, and the result stored with the release
// in one update), a replay 1 (the read), and a retry after a failed run 4
// (the read, the claim, the run's start, the result with the release), in
// both modes.
func TestRoundTripsPerRequest(t *testing.T) { eachMode(t, testRoundTripsPerRequest) }

//nolint:thelper // the body of a test, run once per mode
func testRoundTripsPerRequest(t *testing.T, mode lease.Mode) {
	b := setup(t)
	var (
		mu    sync.Mutex
		names []string
	)
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.DatabaseName == b.db.Name() {
			mu.Lock()
			names = append(names, e.CommandName)
			mu.Unlock()
		}
	}}
	client, err := mongo.Connect(options.Client().ApplyURI(b.db.Server.URI).SetMonitor(mon))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	mdb := client.Database(b.db.Name())
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := names
		names = nil
		return out
	}
	k, err := idempotency.New(mdb.Collection("keys"), &idempotency.Options{TTL: time.Minute, Mode: mode, Clock: b.clock})
	require.NoError(t, err)
	orders := mdb.Collection("orders")
	h, err := k.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := orders.InsertOne(r.Context(), bson.D{{Key: "item", Value: "mug"}}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}), nil)
	require.NoError(t, err)
	send := func(key string) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/orders", strings.NewReader(`{"item":"mug"}`))
		req.Header.Set(idempotency.HeaderKey, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	require.Equal(t, http.StatusCreated, send("warm-up").Code) // the collections' creation
	take()

	require.Equal(t, http.StatusCreated, send("k1").Code)
	first := take()
	t.Logf("first request: %v", first)
	require.Equal(t, []string{"find", "insert", "insert", "update"}, first, "the record's read, its insert with the claim, the handler's insert, the result with the release")

	w := send("k1")
	require.Equal(t, http.StatusCreated, w.Code)
	require.Equal(t, "true", w.Header().Get(idempotency.HeaderReplayed))
	replay := take()
	t.Logf("replay: %v", replay)
	require.Equal(t, []string{"find"}, replay)

	// A retry after a failed run claims the record and marks the run's
	// start. The first such claim of the Keys is not counted: FerretDB v1
	// refuses a findAndModify's projection once, and the claim is sent
	// again without it.
	retried := func(key string) []string {
		_, err := k.Do(t.Context(), key, nil, func(context.Context, *idempotency.Call) (idempotency.Result, error) {
			return idempotency.Result{}, errFirstRun
		})
		require.ErrorIs(t, err, errFirstRun)
		take()
		_, err = k.Do(t.Context(), key, nil, counting(new(atomic.Int32), idempotency.Result{Status: 201}))
		require.NoError(t, err)
		return take()
	}
	retried("k2-warm-up")
	retry := retried("k2")
	t.Logf("retry after a failed run: %v", retry)
	require.Equal(t, []string{"find", "findAndModify", "findAndModify", "update"}, retry, "read, claim, begin, result with the release")
}

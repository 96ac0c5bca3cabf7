package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
)

// TestRetention: a record is kept for Retention after its request last ran,
// then cleaned up (Sweep; a TTL index where the server has them): a
// completed record, and one whose request failed, go; one whose request ran
// since stays. A request with a cleaned-up key runs as a new one.
func TestRetention(t *testing.T) {
	// A claim outlives the round trips of a busy machine (2 s); records
	// outlive their claims (4 s).
	const retention = 4 * time.Second
	b := setup(t)
	ctx := context.Background()
	k := b.keys(t, nil, "a", &idempotency.Options{TTL: 2 * time.Second, Retention: retention})
	require.Equal(t, retention, k.Retention())
	ttl, err := k.EnsureIndexes(ctx)
	require.NoError(t, err)
	require.Equal(t, b.db.Caps().TTLIndexes, ttl, "a TTL index exactly where the server deletes with them")
	specs, err := b.coll.Indexes().ListSpecifications(ctx)
	require.NoError(t, err)
	found := false
	for _, s := range specs {
		if s.Name == idempotency.TTLIndexName {
			found = true
			require.NotNil(t, s.ExpireAfterSeconds)
			require.Zero(t, *s.ExpireAfterSeconds, "each record carries its own expiry")
		}
	}
	require.Equal(t, ttl, found)

	ok := func(context.Context, *idempotency.Call) (idempotency.Result, error) {
		return idempotency.Result{Status: 200}, nil
	}
	_, err = k.Do(ctx, "completed", []byte("first"), ok)
	require.NoError(t, err)
	errDown := errors.New("partner down")
	_, err = k.Do(ctx, "failed", nil, func(context.Context, *idempotency.Call) (idempotency.Result, error) {
		return idempotency.Result{}, errDown
	})
	require.ErrorIs(t, err, errDown)
	_, err = k.Do(ctx, "renewed", nil, func(context.Context, *idempotency.Call) (idempotency.Result, error) {
		return idempotency.Result{}, errDown
	})
	require.ErrorIs(t, err, errDown)

	before := load(t, b.coll, "completed").ExpireAt
	time.Sleep(retention + 300*time.Millisecond)
	// "renewed" runs again now: its retention starts over.
	_, err = k.Do(ctx, "renewed", nil, ok)
	require.NoError(t, err)
	require.True(t, load(t, b.coll, "renewed").ExpireAt.After(before.Add(retention/2)))

	n, err := k.Sweep(ctx)
	require.NoError(t, err)
	if ttl {
		require.LessOrEqual(t, n, 2, "the TTL monitor may have deleted some already")
	} else {
		require.Equal(t, 2, n, "the completed and the failed records")
	}
	ids, err := b.coll.Distinct(ctx, "_id", bson.D{}).Raw()
	require.NoError(t, err)
	require.Equal(t, `["renewed"]`, ids.String())

	res, err := k.Do(ctx, "completed", []byte("another request"), ok)
	require.NoError(t, err, "the key is free again: no mismatch with the forgotten request")
	require.False(t, res.Replayed)
}

// TestTTLIndexDeletes runs where the server deletes documents with TTL
// indexes (DocumentDB, MongoDB): the index removes an expired record by
// itself.
func TestTTLIndexDeletes(t *testing.T) {
	mongotest.Use(t, mongotest.TTLIndexes)
	b := setup(t)
	ctx := context.Background()
	// Long enough that a busy machine's round trips neither lose the claim
	// nor outlast the record before it is counted.
	k := b.keys(t, nil, "a", &idempotency.Options{TTL: 5 * time.Second, Retention: 10 * time.Second})
	ttl, err := k.EnsureIndexes(ctx)
	require.NoError(t, err)
	require.True(t, ttl)
	_, err = k.Do(ctx, "k", nil, func(context.Context, *idempotency.Call) (idempotency.Result, error) {
		return idempotency.Result{Status: 200}, nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(1), count(t, b.coll))
	// MongoDB's TTL monitor runs every 60s.
	require.Eventually(t, func() bool {
		n, err := b.coll.CountDocuments(ctx, bson.D{})
		return err == nil && n == 0
	}, 3*time.Minute, time.Second)
}

// TestRecordKeptWhileItsRequestRuns: a request that runs for longer than
// Retention keeps its record, because each renewal of its claim moves the
// record's retention time forward. The clean-up runs all along (Sweep every
// 50ms, the TTL index too where the server has one); a second request with
// the key, made when Retention has passed twice since the first one began,
// is told ErrInProgress and does not run; once the first completes, a retry
// gets its stored result. The function runs exactly once.
func TestRecordKeptWhileItsRequestRuns(t *testing.T) { eachMode(t, testRecordKeptWhileRunning) }

//nolint:thelper // the body of a test, run once per mode
func testRecordKeptWhileRunning(t *testing.T, mode lease.Mode) {
	// A claim renewed every 5/3 s outlives a busy machine's round trips (a
	// 3 s one was lost on DocumentDB with three suites on two cores); the
	// second request comes at 2 x Retention = 12 s.
	const (
		ttl       = 5 * time.Second
		retention = 6 * time.Second
	)
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := b.keys(t, nil, "a", &idempotency.Options{TTL: ttl, Retention: retention, Mode: mode})
	_, err := k.EnsureIndexes(ctx)
	require.NoError(t, err)

	sweepCtx, stopSweep := context.WithCancel(ctx)
	swept := make(chan error, 1)
	go func() {
		for {
			if _, err := k.Sweep(sweepCtx); err != nil {
				if sweepCtx.Err() != nil {
					err = nil
				}
				swept <- err
				return
			}
			select {
			case <-sweepCtx.Done():
				swept <- nil
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	defer func() {
		stopSweep()
		require.NoError(t, <-swept)
	}()

	var runs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	fn := func(ctx context.Context, _ *idempotency.Call) (idempotency.Result, error) {
		n := runs.Add(1)
		if n == 1 {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
				return idempotency.Result{}, context.Cause(ctx)
			}
		}
		return idempotency.Result{Status: 201, Body: fmt.Appendf(nil, "run %d", n)}, nil
	}
	type answer struct {
		res idempotency.Result
		err error
	}
	first := make(chan answer, 1)
	begun := time.Now()
	go func() {
		res, err := k.Do(ctx, "long", []byte("fp"), fn)
		first <- answer{res, err}
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the first request did not start its function")
	}

	time.Sleep(time.Until(begun.Add(2 * retention)))
	_, err = k.Do(ctx, "long", []byte("fp"), fn)
	require.ErrorIs(t, err, idempotency.ErrInProgress, "the record of the running request was kept: the retry waits for it")
	require.Equal(t, int32(1), runs.Load())

	close(release)
	var a answer
	select {
	case a = <-first:
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the first request did not end")
	}
	require.NoError(t, a.err)
	require.False(t, a.res.Replayed)
	require.Equal(t, "run 1", string(a.res.Body))

	again, err := k.Do(ctx, "long", []byte("fp"), fn)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, "run 1", string(again.Body))
	require.Equal(t, int32(1), runs.Load(), "the function ran once")
}

package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/mongotest"
)

// TestRetention: a record is kept for Retention after its request last ran,
// then cleaned up (Sweep; a TTL index where the server has them): a
// completed record, and one whose request failed, go; one whose request ran
// since stays. A request with a cleaned-up key runs as a new one.
func TestRetention(t *testing.T) {
	const retention = 2 * time.Second
	b := setup(t)
	ctx := context.Background()
	k := b.keys(t, nil, "a", &idempotency.Options{TTL: time.Second, Retention: retention})
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
	b := setup(t)
	b.db.Require(t, mongotest.TTLIndexes)
	ctx := context.Background()
	k := b.keys(t, nil, "a", &idempotency.Options{TTL: time.Second, Retention: 2 * time.Second})
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

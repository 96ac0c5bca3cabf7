package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/tests/internal/errmsg"
)

// TestErrorsSayTheirPrefixOnce triggers the errors each entry point returns
// before and after reaching the server, and checks each message's prefix.
func TestErrorsSayTheirPrefixOnce(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	ctx := context.Background()
	coll := db.Collection("docs")
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "a"}})
	require.NoError(t, err)
	m, err := lease.New(coll, &lease.Options{TTL: time.Minute, Owner: "w1"})
	require.NoError(t, err)
	m2, err := lease.New(coll, &lease.Options{TTL: time.Minute, Owner: "w2"})
	require.NoError(t, err)
	named, err := lease.NewNamed(db.Collection("locks"), &lease.Options{TTL: time.Minute, Owner: "w1"})
	require.NoError(t, err)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	_, err = m.Acquire(ctx, "nobody")
	require.ErrorIs(t, err, lease.ErrNotFound)
	errmsg.RequireOnePrefix(t, err)
	require.Equal(t, "lease: acquire nobody: document not found", err.Error())

	_, err = m.TryAcquire(ctx, bson.D{{Key: "$gt", Value: ""}})
	require.ErrorIs(t, err, lease.ErrInvalid)
	errmsg.RequireOnePrefix(t, err)

	_, err = m.TryAcquire(cancelled, "a")
	require.ErrorIs(t, err, context.Canceled)
	errmsg.RequireOnePrefix(t, err)

	_, err = lease.New(coll, &lease.Options{TTL: -time.Second})
	require.ErrorIs(t, err, lease.ErrInvalid)
	errmsg.RequireOnePrefix(t, err)

	err = m.Do(ctx, "a", nil)
	require.ErrorIs(t, err, lease.ErrInvalid)
	errmsg.RequireOnePrefix(t, err)

	l, err := m.TryAcquire(ctx, "a")
	require.NoError(t, err)
	_, err = m2.TryAcquire(ctx, "a")
	require.ErrorIs(t, err, lease.ErrHeld)
	errmsg.RequireOnePrefix(t, err)
	err = l.Stamp(ctx, coll, "a")
	require.ErrorIs(t, err, lease.ErrInvalid)
	errmsg.RequireOnePrefix(t, err)
	require.NoError(t, l.Release(ctx))
	err = l.Renew(ctx)
	require.Error(t, err)
	errmsg.RequireOnePrefix(t, err)

	nl, err := named.TryAcquire(ctx, "job")
	require.NoError(t, err)
	err = nl.Stamp(ctx, coll, "missing")
	require.ErrorIs(t, err, lease.ErrNotFound)
	errmsg.RequireOnePrefix(t, err)
	err = nl.Stamp(ctx, coll, bson.D{{Key: "$ne", Value: 1}})
	require.ErrorIs(t, err, lease.ErrInvalid)
	errmsg.RequireOnePrefix(t, err)
	require.NoError(t, nl.Release(ctx))

	_, err = m.Sweep(ctx)
	require.ErrorIs(t, err, lease.ErrNotNamed)
	errmsg.RequireOnePrefix(t, err)
	_, err = m.Mode(cancelled)
	require.Error(t, err)
	errmsg.RequireOnePrefix(t, err)
}

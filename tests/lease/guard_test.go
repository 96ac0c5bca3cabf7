package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/versioned"
)

type item struct {
	ID      bson.ObjectID `bson:"_id"`
	Data    string        `bson:"data"`
	Version int64         `bson:"version"`
}

// TestGuard: versioned writes fenced with WhereErr(Fence, ErrLost) succeed while the lease is
// held, keep the lease record intact, and fail with ErrLost, changing
// nothing, once the lease was taken over.
func TestGuard(t *testing.T) { eachMode(t, testGuard) }

//nolint:thelper // the body of a test, run once per mode
func testGuard(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	repo, err := versioned.New[item](b.coll, nil)
	require.NoError(t, err)
	it := &item{ID: bson.NewObjectID(), Data: "initial"}
	require.NoError(t, repo.Insert(ctx, it))

	// a's guarded writes below must land before its deadline (0.9 TTL), on
	// a loaded machine too; then c waits the TTL out.
	const ttl = 2 * time.Second
	a := b.manager(t, "a", ttl, nil)
	// c's own lease lives through every step below.
	c := b.manager(t, "c", time.Minute, &lease.Options{Retry: fastRetry})
	la, err := a.TryAcquire(ctx, it.ID)
	require.NoError(t, err)

	it.Data = "by a"
	require.NoError(t, repo.Update(ctx, it, versioned.WhereErr(la.Fence(), lease.ErrLost)))
	_, err = repo.Modify(ctx, it.ID, func(x *item) error { x.Data += ", modified"; return nil }, versioned.WhereErr(la.Fence(), lease.ErrLost))
	require.NoError(t, err)
	d := load(t, b.coll, it.ID)
	require.Equal(t, "by a, modified", d.Data)
	require.Equal(t, "a", owner(d.Lease), "versioned writes leave the lease record alone")
	require.Equal(t, la.Epoch(), d.Lease.Epoch)

	// a stops renewing; c takes over.
	lc, err := c.Acquire(ctx, it.ID)
	require.NoError(t, err)
	before := loadRaw(t, b.coll, it.ID)

	stale, err := repo.Get(ctx, it.ID)
	require.NoError(t, err)
	stale.Data = "by a, after losing the lease"
	err = repo.Update(ctx, stale, versioned.WhereErr(la.Fence(), lease.ErrLost))
	require.ErrorIs(t, err, lease.ErrLost)
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	_, err = repo.Modify(ctx, it.ID, func(x *item) error { x.Data = "stale modify"; return nil }, versioned.WhereErr(la.Fence(), lease.ErrLost))
	require.ErrorIs(t, err, lease.ErrLost)
	require.Equal(t, before, loadRaw(t, b.coll, it.ID), "the stale holder changed nothing")

	stale.Data = "by c"
	require.NoError(t, repo.Update(ctx, stale, versioned.WhereErr(lc.Fence(), lease.ErrLost)))
	require.NoError(t, lc.Release(ctx))
}

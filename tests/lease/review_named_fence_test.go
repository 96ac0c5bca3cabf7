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

// TestNamedFenceEndsAtRelease (review, item 2): a named lease's holder
// stamps a document and releases the name; another owner claims the name but
// has not stamped yet. The released holder's Fence matches nothing, and a
// versioned write fenced with it fails with ErrLost: a fence ends at the holder's release as known
// locally, not only at the next holder's stamp.
func TestNamedFenceEndsAtRelease(t *testing.T) { eachMode(t, testNamedFenceEndsAtRelease) }

//nolint:thelper // the body of a test, run once per mode
func testNamedFenceEndsAtRelease(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	locks := b.db.Collection("locks")
	a := b.named(t, locks, "a", 10*time.Second, nil)
	c := b.named(t, locks, "c", 10*time.Second, nil)
	const name = "partner-api:user:42"
	_, err := b.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "u42"}, {Key: "n", Value: 0}})
	require.NoError(t, err)

	la, err := a.TryAcquire(ctx, name)
	require.NoError(t, err)
	require.NoError(t, la.Stamp(ctx, b.coll, "u42"))
	inc := bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}
	res, err := b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: "u42"}}, la.Fence()...), inc)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.MatchedCount, "the fence matches while held")
	require.NoError(t, la.Release(ctx))

	// Released, nobody else yet: the fence matches nothing.
	res, err = b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: "u42"}}, la.Fence()...), inc)
	require.NoError(t, err)
	require.Zero(t, res.MatchedCount, "a's fenced write applied after a released the name")

	lc, err := c.TryAcquire(ctx, name) // taken over (c has not stamped yet)
	require.NoError(t, err)
	defer func() { _ = lc.Release(ctx) }()

	// a, released and taken over, writes with its fence.
	res, err = b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: "u42"}}, la.Fence()...), inc)
	require.NoError(t, err)
	require.Zero(t, res.ModifiedCount, "a's fenced write applied after a released the name and c claimed it (a epoch %d, c epoch %d)", la.Epoch(), lc.Epoch())

	type counter struct {
		ID      string `bson:"_id"`
		N       int    `bson:"n"`
		Version int64  `bson:"version"`
	}
	repo, err := versioned.New[counter](b.coll, nil)
	require.NoError(t, err)
	require.NoError(t, b.coll.FindOne(ctx, bson.D{{Key: "_id", Value: "u42"}}).Err())
	err = repo.Update(ctx, &counter{ID: "u42", N: 99}, versioned.WhereErr(la.Fence(), lease.ErrLost))
	require.ErrorIs(t, err, lease.ErrLost, "the fence of a released lease")
	var n struct {
		N int `bson:"n"`
	}
	require.NoError(t, b.coll.FindOne(ctx, bson.D{{Key: "_id", Value: "u42"}}).Decode(&n))
	require.Equal(t, 1, n.N, "only the write made while held applied")
}

// TestDocumentFenceEndsAtLocalLoss (review, item 2): a document lease's Fence
// matches nothing once the Lease knows it is released or lost, even before
// anyone else changed the record.
func TestDocumentFenceEndsAtLocalLoss(t *testing.T) { eachMode(t, testDocumentFenceEndsAtLocalLoss) }

//nolint:thelper // the body of a test, run once per mode
func testDocumentFenceEndsAtLocalLoss(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	m := b.manager(t, "a", 10*time.Second, nil)
	id := b.insert(t)
	l, err := m.TryAcquire(ctx, id)
	require.NoError(t, err)
	fence := l.Fence() // taken while held
	require.NoError(t, l.Release(ctx))
	set := bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "after release"}}}}
	res, err := b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, l.Fence()...), set)
	require.NoError(t, err)
	require.Zero(t, res.MatchedCount, "Fence after Release")
	res, err = b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, fence...), set)
	require.NoError(t, err)
	require.Zero(t, res.MatchedCount, "a fence taken before Release, used after it")
	require.Equal(t, "initial", load(t, b.coll, id).Data)
}

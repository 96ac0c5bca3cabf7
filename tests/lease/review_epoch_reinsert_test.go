package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/lease"
)

// TestDocumentEpochNeverRepeatsAfterReinsert (review, item 1): a document is
// deleted and inserted again while one goroutine holds a lease on it, and
// another goroutine of the same Manager (same owner) claims the new document.
// The new lease's epoch is larger than the old one (the first epoch of a
// record is the server's time in microseconds, not 1), and the old, lost
// lease's fenced write changes nothing on the new document.
func TestDocumentEpochNeverRepeatsAfterReinsert(t *testing.T) {
	eachMode(t, testDocumentEpochNeverRepeatsAfterReinsert)
}

//nolint:thelper // the body of a test, run once per mode
func testDocumentEpochNeverRepeatsAfterReinsert(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	m := b.manager(t, "worker", 10*time.Second, nil)
	id := b.insert(t)

	old, err := m.TryAcquire(ctx, id) // goroutine 1: slow work under the lease
	require.NoError(t, err)
	// The first epoch is the server's time in µs (+1), near the claim's.
	require.WithinDuration(t, old.AcquiredAt(), time.UnixMicro(old.Epoch()), 5*time.Second)

	// The document is deleted and inserted again meanwhile.
	_, err = b.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}})
	require.NoError(t, err)
	_, err = b.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "data", Value: "new"}})
	require.NoError(t, err)

	cur, err := m.TryAcquire(ctx, id) // goroutine 2 claims the new document
	require.NoError(t, err)
	defer func() { _ = cur.Release(ctx) }()
	require.Greater(t, cur.Epoch(), old.Epoch(), "epochs never repeat across incarnations of a document")

	// Goroutine 1, whose lease is gone with the old document, writes fenced.
	res, err := b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, old.Fence()...),
		bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "from the lost lease"}}}})
	require.NoError(t, err)
	require.Zero(t, res.MatchedCount, "the lost lease's fenced write applied to the new holder's document (old epoch %d, new epoch %d)", old.Epoch(), cur.Epoch())
	require.Equal(t, "new", load(t, b.coll, id).Data)
}

// TestFenceUniquePerLeaseEvenWithEqualEpochs (review, item 1): even if two
// Leases of one owner had the same epoch (here forced: the document is
// inserted again with a record whose epoch is one below the lost lease's),
// the lost lease's fence does not match the new holder's record, since the
// fence carries the claim id of its own Lease.
func TestFenceUniquePerLeaseEvenWithEqualEpochs(t *testing.T) {
	eachMode(t, testFenceUniquePerLeaseEvenWithEqualEpochs)
}

//nolint:thelper // the body of a test, run once per mode
func testFenceUniquePerLeaseEvenWithEqualEpochs(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	m := b.manager(t, "worker", 10*time.Second, nil)
	id := b.insert(t)

	old, err := m.TryAcquire(ctx, id)
	require.NoError(t, err)
	_, err = b.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}})
	require.NoError(t, err)
	_, err = b.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "data", Value: "new"},
		{Key: "_lease", Value: bson.D{{Key: "epoch", Value: old.Epoch() - 1}}}})
	require.NoError(t, err)

	cur, err := m.TryAcquire(ctx, id)
	require.NoError(t, err)
	defer func() { _ = cur.Release(ctx) }()
	require.Equal(t, old.Epoch(), cur.Epoch(), "the collision this test forces")

	res, err := b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, old.Fence()...),
		bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "from the lost lease"}}}})
	require.NoError(t, err)
	require.Zero(t, res.MatchedCount, "the lost lease's fence matched the new lease's record")
	res, err = b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, cur.Fence()...),
		bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "by the holder"}}}})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.MatchedCount, "the holder's fence matches")

	// The lost lease cannot renew or release the new holder's record either.
	require.ErrorIs(t, old.Renew(ctx), lease.ErrLost)
	require.Equal(t, "worker", owner(load(t, b.coll, id).Lease))
	require.NoError(t, cur.Renew(ctx))
}

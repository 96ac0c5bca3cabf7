package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/versioned"
)

// TestNamedFence: a named lease protects a document of another collection.
// Two holders in sequence each stamp it; the first one's fenced writes
// (Fence with the driver and with versioned, and Stamp itself) fail with
// ErrLost and change nothing, also when the lock document was swept between
// the two holders: the epoch never goes backwards.
func TestNamedFence(t *testing.T) { eachMode(t, testNamedFence) }

//nolint:thelper // the body of a test, run once per mode
func testNamedFence(t *testing.T, mode lease.Mode) {
	for _, swept := range []bool{false, true} {
		t.Run(map[bool]string{false: "lock kept", true: "lock swept"}[swept], func(t *testing.T) {
			b := setup(t, mode)
			ctx := context.Background()
			locks := b.db.Collection("locks")
			repo, err := versioned.New[item](b.coll, nil)
			require.NoError(t, err)
			it := &item{ID: bson.NewObjectID(), Data: "initial"}
			require.NoError(t, repo.Insert(ctx, it))
			const name = "partner-api:user:42"
			a := b.named(t, locks, "a", time.Minute, &lease.Options{CleanupAfter: time.Millisecond})
			c := b.named(t, locks, "c", time.Minute, nil)

			la, err := a.TryAcquire(ctx, name)
			require.NoError(t, err)
			require.NoError(t, la.Stamp(ctx, b.coll, it.ID))
			it.Data = "by a"
			require.NoError(t, repo.Update(ctx, it, versioned.WhereErr(la.Fence(), lease.ErrLost)))
			res, err := b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: it.ID}}, la.Fence()...),
				bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "by a, raw"}}}})
			require.NoError(t, err)
			require.Equal(t, int64(1), res.MatchedCount, "the fence matches while held")
			// a's lease is taken from it: released here, or expired and
			// swept (the lock document deleted).
			require.NoError(t, la.Release(ctx))
			if swept {
				time.Sleep(5 * time.Millisecond)
				n, err := a.Sweep(ctx)
				require.NoError(t, err)
				require.Equal(t, 1, n)
				count, err := locks.CountDocuments(ctx, bson.D{})
				require.NoError(t, err)
				require.Zero(t, count, "the lock document is gone")
			}

			lc, err := c.TryAcquire(ctx, name)
			require.NoError(t, err)
			require.Greater(t, lc.Epoch(), la.Epoch(), "the epoch never goes backwards")
			require.NoError(t, lc.Stamp(ctx, b.coll, it.ID))
			before := loadRaw(t, b.coll, it.ID)

			// a, stale, tries every way to write.
			stale, err := repo.Get(ctx, it.ID)
			require.NoError(t, err)
			stale.Data = "by a, stale"
			err = repo.Update(ctx, stale, versioned.WhereErr(la.Fence(), lease.ErrLost))
			require.ErrorIs(t, err, lease.ErrLost)
			res, err = b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: it.ID}}, la.Fence()...),
				bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "by a, stale raw"}}}})
			require.NoError(t, err)
			require.Zero(t, res.MatchedCount, "the stale fence matches nothing")
			require.Equal(t, before, loadRaw(t, b.coll, it.ID), "the stale holder changed nothing")

			// A stale holder that is still live locally cannot stamp back.
			la2, err := a.TryAcquire(ctx, "other-name")
			require.NoError(t, err)
			require.NoError(t, la2.Release(ctx))

			stale.Data = "by c"
			require.NoError(t, repo.Update(ctx, stale, versioned.WhereErr(lc.Fence(), lease.ErrLost)))
			require.NoError(t, lc.Release(ctx))
		})
	}
}

// TestStampRefusesOlderEpoch: a holder whose lease was taken over cannot
// move a protected document's stamp back, and Stamp checks its inputs
// before sending anything.
func TestStampRefusesOlderEpoch(t *testing.T) { eachMode(t, testStampRefusesOlderEpoch) }

//nolint:thelper // the body of a test, run once per mode
func testStampRefusesOlderEpoch(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	locks := b.db.Collection("locks")
	id := b.insert(t)
	a := b.named(t, locks, "a", time.Second, nil) // c waits it out
	c := b.named(t, locks, "c", time.Minute, &lease.Options{Retry: fastRetry})
	la, err := a.TryAcquire(ctx, "job")
	require.NoError(t, err)
	lc, err := c.Acquire(ctx, "job") // after a's TTL
	require.NoError(t, err)
	require.NoError(t, lc.Stamp(ctx, b.coll, id))
	err = la.Stamp(ctx, b.coll, id)
	require.ErrorIs(t, err, lease.ErrLost)

	// A lease that is still live locally, but older than the stamp.
	b2 := b.named(t, b.db.Collection("locks2"), "z", time.Minute, nil)
	lz, err := b2.TryAcquire(ctx, "job")
	require.NoError(t, err)
	if lz.Epoch() < lc.Epoch() {
		var lost *lease.LostError
		err = lz.Stamp(ctx, b.coll, id)
		require.ErrorAs(t, err, &lost)
		require.Equal(t, lc.Epoch(), lost.HolderEpoch)
	}
	require.NoError(t, lz.Release(ctx))

	require.ErrorIs(t, lc.Stamp(ctx, b.coll, bson.NewObjectID()), lease.ErrNotFound)
	require.ErrorIs(t, lc.Stamp(ctx, b.coll, bson.D{{Key: "$gt", Value: ""}}), lease.ErrInvalidID)
	require.ErrorIs(t, lc.Stamp(ctx, nil, id), lease.ErrInvalid)
	docs := b.manager(t, "d", time.Minute, nil)
	ld, err := docs.TryAcquire(ctx, id)
	require.NoError(t, err)
	require.ErrorIs(t, ld.Stamp(ctx, b.coll, id), lease.ErrInvalid)
	require.NoError(t, ld.Release(ctx))
	require.NoError(t, lc.Release(ctx))
}

// TestSessionStripped: a lease taken with a context that carries a driver
// session never uses it: the session here has ended, so any command sent on
// it would fail. Claim, renewals, release and Do all work.
func TestSessionStripped(t *testing.T) { eachMode(t, testSessionStripped) }

//nolint:thelper // the body of a test, run once per mode
func testSessionStripped(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	sess, err := b.db.Client().StartSession()
	require.NoError(t, err)
	sess.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, sess)
	_, err = b.coll.CountDocuments(sctx, bson.D{})
	require.Error(t, err, "the ended session cannot be used")

	m := b.manager(t, "a", time.Minute, &lease.Options{RenewEvery: 20 * time.Millisecond})
	l, err := m.TryAcquire(sctx, id)
	require.NoError(t, err)
	require.NoError(t, l.Renew(sctx))
	require.NoError(t, l.Release(sctx))
	err = m.Do(sctx, id, func(ctx context.Context, l *lease.Lease) error {
		// Do renews in the background on fn's context, which carries the
		// session.
		if err := renewed(ctx, l); err != nil {
			return err
		}
		return l.Err()
	})
	require.NoError(t, err)
}

package lease_test

// Fences: a lease's Fence matches while it is held and the record
// is its own, and nothing once it is released, lost, taken over, or the
// document was deleted and inserted again (epochs never repeat).

import (
	"context"
	"errors"
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

// "Release, Renew and fenced writes of a lease that was lost change nothing
// and report ErrLost": a lease lost by local expiry (Reason Expired) that
// nobody took over no longer passes its fence in ModeServer; in
// ModeEstimated its fence ends at the next holder's claim.
func TestFencedWriteOfExpiredLeaseChangesNothing(t *testing.T) {
	eachMode(t, testFencedWriteOfExpiredLeaseChangesNothing)
}

//nolint:thelper // the body of a test, run once per mode
func testFencedWriteOfExpiredLeaseChangesNothing(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	m := b.manager(t, "a", time.Second, nil) // waited out below
	l, err := m.TryAcquire(ctx, id)
	require.NoError(t, err)
	<-l.Done()
	require.ErrorIs(t, l.Err(), lease.ErrLost, "the lease is lost (expired)")

	res, err := b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, l.Fence()...),
		bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "written after the lease was lost"}}}})
	require.NoError(t, err)
	if mode == lease.ModeServer {
		require.Zero(t, res.MatchedCount, "BUG (doc): a fenced write of a lost lease changed the document")
		return
	}
	// ModeEstimated: the server has no $$NOW to judge the fence by time, so
	// the write applies until the record changes (the documented
	// guarantee): it is ordered before every later holder's claim, and
	// from that claim on the stale fence matches nothing.
	c := b.manager(t, "c", time.Minute, &lease.Options{Retry: fastRetry})
	lc, err := c.Acquire(ctx, id)
	require.NoError(t, err)
	res, err = b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, l.Fence()...),
		bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "written after the takeover"}}}})
	require.NoError(t, err)
	require.Zero(t, res.MatchedCount, "a fenced write of a lost lease after a takeover changed the document")
	require.NoError(t, lc.Release(ctx))
}

// For a named lease the record lives in the lock document; its Fence
// matches the protected resource once the holder stamped it: a fenced write to
// the stamped document matches while the lease is held.
func TestNamedLeaseFenceMatchesStampedDocument(t *testing.T) {
	eachMode(t, testNamedLeaseFenceMatchesStampedDocument)
}

//nolint:thelper // the body of a test, run once per mode
func testNamedLeaseFenceMatchesStampedDocument(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t) // the protected document, in b.coll
	m := b.named(t, b.db.Collection("locks"), "a", time.Minute, nil)
	err := m.Do(ctx, "user:"+id.Hex(), func(ctx context.Context, l *lease.Lease) error {
		// A named lease fences a document it stamped first.
		if err := l.Stamp(ctx, b.coll, id); err != nil {
			return err
		}
		res, err := b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, l.Fence()...),
			bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "under the lease"}}}})
		if err != nil {
			return err
		}
		if res.MatchedCount == 0 {
			return errors.New("the fenced write matched nothing while the lease was held")
		}
		return nil
	})
	require.NoError(t, err, "BUG (design/doc): named leases cannot fence the resource they protect")
}

// TestNamedFenceEndsAtRelease: a named lease's holder
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

// TestDocumentFenceEndsAtLocalLoss: a document lease's Fence
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

// TestDocumentEpochNeverRepeatsAfterReinsert: a document is
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

// TestFenceUniquePerLeaseEvenWithEqualEpochs: even if two
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

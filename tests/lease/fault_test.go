package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

// TestDroppedReply: the server applies a claim, renewal or release but its
// reply is lost (a network error after the write). The lease re-reads and
// learns the truth: no stuck lease, no double holder.
func TestDroppedReply(t *testing.T) { eachMode(t, testDroppedReply) }

//nolint:thelper // the body of a test, run once per mode
func testDroppedReply(t *testing.T, mode lease.Mode) {
	// Far above the re-reads' ResolveTimeout (10s): every lease here is
	// still held when its check comes.
	const ttl = time.Minute
	ctx := context.Background()
	b := setup(t, mode)
	f := b.db.Faulty(t, nil)
	coll := f.Collection(b.coll.Name())
	a := b.managerOn(t, coll, "a", ttl, nil)
	c := b.manager(t, "c", ttl, nil)
	claims := mongotest.Commands([]string{"findAndModify"}, b.coll.Name())
	updates := mongotest.Commands([]string{"update"}, b.coll.Name())
	renewals := updates
	if mode == lease.ModeServer {
		// A renewal in ModeServer is a findAndModify: it returns the
		// server's time of the renewal.
		renewals = claims
	}

	t.Run("acquire applied", func(t *testing.T) {
		droppedClaim(t, f, a, c, b.coll, b.insert(t))
	})

	t.Run("acquire not applied", func(t *testing.T) {
		id := b.insert(t)
		lc, err := c.TryAcquire(ctx, id)
		require.NoError(t, err)
		fault := f.DropNextReply(claims)
		_, err = a.TryAcquire(ctx, id)
		require.True(t, fault.HasFired())
		require.ErrorIs(t, err, lease.ErrHeld, "the re-read found c holding it")
		var held *lease.HeldError
		require.ErrorAs(t, err, &held)
		require.Equal(t, "c", held.Owner)
		require.NoError(t, lc.Release(ctx))
	})

	t.Run("acquire of a named lease applied", func(t *testing.T) {
		locks := f.Collection("locks")
		na, err := lease.NewNamed(locks, &lease.Options{TTL: ttl, Owner: "a", Clock: a.Clock(), Mode: b.mode})
		require.NoError(t, err)
		nc, err := lease.NewNamed(b.db.Collection("locks"), &lease.Options{TTL: ttl, Owner: "c", Clock: b.clock, Mode: b.mode})
		require.NoError(t, err)
		droppedClaim(t, f, na, nc, b.db.Collection("locks"), "partner-api:user:42")
	})

	t.Run("renew applied", func(t *testing.T) {
		id := b.insert(t)
		la, err := a.TryAcquire(ctx, id)
		require.NoError(t, err)
		before := la.ExpiresAt()
		time.Sleep(5 * time.Millisecond)
		fault := f.DropNextReply(renewals)
		require.NoError(t, la.Renew(ctx), "the re-read found the renewal applied")
		require.True(t, fault.HasFired())
		require.True(t, la.ExpiresAt().After(before))
		require.True(t, load(t, b.coll, id).Lease.ExpiresAt.Equal(la.ExpiresAt()))
		require.NoError(t, la.Release(ctx))
	})

	t.Run("release applied", func(t *testing.T) {
		id := b.insert(t)
		la, err := a.TryAcquire(ctx, id)
		require.NoError(t, err)
		fault := f.DropNextReply(updates)
		require.NoError(t, la.Release(ctx), "the re-read found the release applied")
		require.True(t, fault.HasFired())
		require.ErrorIs(t, la.Err(), lease.ErrReleased)
		d := load(t, b.coll, id)
		require.Empty(t, owner(d.Lease))
		require.Equal(t, la.Epoch(), d.Lease.Epoch)
		requireFree(t, c, id, la.Epoch()+1)
	})

	t.Run("unresolved", func(t *testing.T) {
		// The reply is lost and the re-read fails too: the outcome is
		// reported as unknown, matching the network error.
		id := b.insert(t)
		la, err := a.TryAcquire(ctx, id)
		require.NoError(t, err)
		f.DropReplies(1, updates)
		f.DropReplies(100, mongotest.Commands([]string{"find"}, b.coll.Name()))
		err = la.Release(ctx)
		require.ErrorIs(t, err, lease.ErrUnknownOutcome)
		require.True(t, store.IsNetwork(err), "%v", err)
		require.NoError(t, la.Err(), "still held as far as anyone knows")
	})
}

// droppedClaim has a (whose traffic passes f) claim id while the reply of
// its findAndModify is dropped: a must learn from a re-read that it holds the
// lease, exactly once, and c must neither hold it too nor find it stuck after
// a releases.
func droppedClaim(t *testing.T, f *mongotest.Faulty, a, c *lease.Manager, coll *mongo.Collection, id any) {
	t.Helper()
	ctx := context.Background()
	fault := f.DropNextReply(mongotest.Commands([]string{"findAndModify"}, coll.Name()))
	la, err := a.TryAcquire(ctx, id)
	require.True(t, fault.HasFired())
	require.NoError(t, err, "the re-read found the claim applied")
	d := load(t, coll, id)
	require.Equal(t, a.Owner(), owner(d.Lease))
	require.Equal(t, la.Epoch(), d.Lease.Epoch)

	_, err = c.TryAcquire(ctx, id)
	require.ErrorIs(t, err, lease.ErrHeld, "no double holder")
	require.NoError(t, la.Release(ctx))
	requireFree(t, c, id, la.Epoch()+1)
}

// requireFree checks that m can take the lease on id at once, with epoch
// want: it is not stuck. It releases it again.
func requireFree(t *testing.T, m *lease.Manager, id any, want int64) {
	t.Helper()
	ctx := context.Background()
	l, err := m.TryAcquire(ctx, id)
	require.NoError(t, err, "no stuck lease")
	require.Equal(t, want, l.Epoch())
	require.NoError(t, l.Release(ctx))
}

// A release that finds the record no longer naming this holder, and cannot
// re-read it, reports the lease lost with reason Unread (not a takeover it
// never saw) and changes nothing.
func TestReleaseWithFailedRereadIsUnread(t *testing.T) {
	eachMode(t, testReleaseWithFailedRereadIsUnread)
}

//nolint:thelper // the body of a test, run once per mode
func testReleaseWithFailedRereadIsUnread(t *testing.T, mode lease.Mode) {
	ctx := context.Background()
	b := setup(t, mode)
	f := b.db.Faulty(t, nil)
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", time.Minute, nil)
	id := b.insert(t)
	la, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)

	// Someone else's claim lands behind a's back (as after an expiry).
	_, err = b.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{
		{Key: "$set", Value: bson.D{{Key: "_lease.owner", Value: "z"}}},
		{Key: "$inc", Value: bson.D{{Key: "_lease.epoch", Value: 1}}},
	})
	require.NoError(t, err)

	fault := f.DropReplies(50, mongotest.Commands([]string{"find"}, b.coll.Name()))
	err = la.Release(ctx)
	require.NotEmpty(t, fault.Dropped(), "the re-read's replies were dropped")
	require.ErrorIs(t, err, lease.ErrLost)
	require.NotErrorIs(t, err, lease.ErrReleased)
	var lost *lease.LostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, lease.Unread, lost.Reason)
	require.Empty(t, lost.Holder, "no holder is claimed without a read")
	require.True(t, store.IsNetwork(lost.Err), "Err is the re-read's failure: %v", lost.Err)
	require.Error(t, la.Context().Err(), "the lease's context ended")
	require.Equal(t, "z", owner(load(t, b.coll, id).Lease), "the release changed nothing")
}

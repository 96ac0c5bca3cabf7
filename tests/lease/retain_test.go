package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/lease"
)

// TestRenewalMovesRetain: with Options.Retain, each renewal of a document
// lease sets the named field to its own time plus RetainFor, in the
// renewal's write (so it sits exactly RetainFor-TTL past the lease's new
// expiry), and keeps a later time already there. Without Retain a renewal
// writes no such field.
func TestRenewalMovesRetain(t *testing.T) { eachMode(t, testRenewalMovesRetain) }

//nolint:thelper // the body of a test, run once per mode
func testRenewalMovesRetain(t *testing.T, mode lease.Mode) {
	const (
		ttl       = time.Minute
		retainFor = 10 * time.Minute
	)
	b := setup(t, mode)
	ctx := context.Background()
	keepUntil := func(id bson.ObjectID) (time.Time, bool) {
		v, err := loadRaw(t, b.coll, id).LookupErr("keepUntil")
		if err != nil {
			return time.Time{}, false
		}
		return v.Time(), true
	}

	m := b.manager(t, "a", ttl, &lease.Options{Retain: "keepUntil", RetainFor: retainFor})
	id := b.insert(t)
	old := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	_, err := b.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "keepUntil", Value: old}}}})
	require.NoError(t, err)
	l, err := m.TryAcquire(ctx, id)
	require.NoError(t, err)
	got, ok := keepUntil(id)
	require.True(t, ok)
	require.True(t, got.Equal(old), "a claim leaves the field alone: %v", got)
	for range 2 {
		time.Sleep(5 * time.Millisecond) // the server's clock moves between renewals
		require.NoError(t, l.Renew(ctx))
		d := load(t, b.coll, id)
		got, ok = keepUntil(id)
		require.True(t, ok)
		require.Equal(t, retainFor-ttl, got.Sub(*d.Lease.ExpiresAt), "keepUntil %v, lease expiry %v", got, *d.Lease.ExpiresAt)
	}

	later := got.Add(time.Hour) // past what the next renewal would set
	_, err = b.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "keepUntil", Value: later}}}})
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx))
	got, _ = keepUntil(id)
	require.True(t, got.Equal(later), "a later time is kept: %v, want %v", got, later)
	require.NoError(t, l.Release(ctx))

	plain := b.manager(t, "b", ttl, nil)
	other := b.insert(t)
	l, err = plain.TryAcquire(ctx, other)
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx))
	_, ok = keepUntil(other)
	require.False(t, ok, "without Retain a renewal writes only the lease")
	require.NoError(t, l.Release(ctx))
}

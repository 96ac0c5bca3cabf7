package versioned_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/versioned"
)

// TestWithSet: WithSet's fields ride in the statement of the write they are
// given to (Update, Modify, Guarded), only when it writes, and a path the
// model, the repository or the update owns is refused before anything is
// sent.
func TestWithSet(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &account{ID: "a1", Balance: 10}))
	stamp := func(n int) versioned.WriteOption { return versioned.WithSet(bson.E{Key: "stamps.k1", Value: n}) }
	stamps := func() bson.M {
		m, _ := b.raw(t, "a1")["stamps"].(bson.M)
		return m
	}

	// Modify: set with fn's change, not when fn changes nothing.
	_, err := repo.Modify(b.ctx, "a1", func(*account) error { return nil }, stamp(1))
	require.NoError(t, err)
	require.Nil(t, stamps(), "fn changed nothing: nothing written")
	a, err := repo.Modify(b.ctx, "a1", func(a *account) error { a.Balance++; return nil }, stamp(2))
	require.NoError(t, err)
	require.Equal(t, int64(11), a.Balance)
	require.Equal(t, bson.M{"k1": int32(2)}, stamps())

	// Guarded: merged into the update's $set, or as one of its own.
	_, err = repo.Guarded(b.ctx, "a1", nil, bson.M{"$set": bson.M{"note": "x"}}, stamp(3))
	require.NoError(t, err)
	require.Equal(t, bson.M{"k1": int32(3)}, stamps())
	_, err = repo.Guarded(b.ctx, "a1", nil, bson.M{"$inc": bson.M{"balance": 1}}, stamp(4))
	require.NoError(t, err)
	require.Equal(t, bson.M{"k1": int32(4)}, stamps())

	// Update.
	a, err = repo.Get(b.ctx, "a1")
	require.NoError(t, err)
	a.Balance = 20
	require.NoError(t, repo.Update(b.ctx, a, stamp(5)))
	require.Equal(t, bson.M{"k1": int32(5)}, stamps())
	require.Equal(t, int64(20), b.raw(t, "a1")["balance"])

	// A failed write sets nothing.
	_, err = repo.Modify(b.ctx, "a1", func(a *account) error { a.Balance++; return nil }, stamp(6),
		versioned.Where(bson.D{{Key: "balance", Value: 0}}))
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	require.Equal(t, bson.M{"k1": int32(5)}, stamps())

	before := b.rawBytes(t, "a1")
	for _, bad := range []bson.E{
		{Key: "balance", Value: 1}, {Key: "attrs.x", Value: "y"}, {Key: "_id", Value: "b"},
		{Key: "version", Value: 1}, {Key: "_mc.x", Value: 1}, {Key: "_lease.owner", Value: "me"},
		{Key: "a..b", Value: 1}, {Key: "$x", Value: 1}, {Key: "s", Value: bson.M{"$gt": 1}},
	} {
		_, err := repo.Modify(b.ctx, "a1", func(a *account) error { a.Balance++; return nil }, versioned.WithSet(bad))
		require.ErrorIs(t, err, versioned.ErrInvalid, "%s", bad.Key)
		_, err = repo.Guarded(b.ctx, "a1", nil, bson.M{"$inc": bson.M{"balance": 1}}, versioned.WithSet(bad))
		require.ErrorIs(t, err, versioned.ErrInvalid, "%s", bad.Key)
	}
	_, err = repo.Modify(b.ctx, "a1", func(a *account) error { a.Balance++; return nil },
		versioned.WithSet(bson.E{Key: "s.a", Value: 1}, bson.E{Key: "s", Value: 2}))
	require.ErrorIs(t, err, versioned.ErrInvalid, "overlapping fields")
	_, err = repo.Guarded(b.ctx, "a1", nil, bson.M{"$set": bson.M{"stamps.k1": 9}}, stamp(7))
	require.ErrorIs(t, err, versioned.ErrInvalid, "a field the update sets too")
	require.ErrorIs(t, repo.Delete(b.ctx, a, stamp(8)), versioned.ErrInvalid)
	require.Equal(t, before, b.rawBytes(t, "a1"), "nothing sent")
}

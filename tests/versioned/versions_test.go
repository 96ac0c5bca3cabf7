package versioned_test

// Versions are opaque: a random start per document, one more per write, and
// never a wrap past math.MaxInt64.

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/versioned"
)

// TestInsertStartsAtARandomVersion: versions are opaque. Insert starts each
// document at a random version in [1, 2^52) (exact as a JavaScript number),
// and each write raises it by one.
func TestInsertStartsAtARandomVersion(t *testing.T) {
	repo, b := setup[account](t, nil)
	seen := map[int64]bool{}
	for i := range 8 {
		a := &account{ID: fmt.Sprintf("r-%d", i), Balance: 1}
		require.NoError(t, repo.Insert(b.ctx, a))
		require.GreaterOrEqual(t, a.Version, int64(1))
		require.Less(t, a.Version, int64(1)<<52)
		require.Equal(t, a.Version, b.raw(t, a.ID)["version"], "the stored version is the one reported")
		seen[a.Version] = true
		before := a.Version
		a.Balance++
		require.NoError(t, repo.Update(b.ctx, a))
		require.Equal(t, before+1, a.Version)
	}
	require.Len(t, seen, 8, "eight inserts, eight different starting versions")
}

// TestVersionNeverOverflows: a document at version math.MaxInt64 (written
// by another program) is a *VersionTypeError to read, and a copy claiming
// that version is refused before anything is sent; a document at the last
// version a document can have (MaxInt64-1) reads, but Update, Modify and
// Guarded refuse to raise it (Guarded's filter keeps the server from
// wrapping it too). Nothing is written and the stored version never wraps.
func TestVersionNeverOverflows(t *testing.T) {
	repo, b := setup[account](t, nil)
	ctx := b.ctx
	_, err := b.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "max"}, {Key: "owner", Value: "x"}, {Key: "version", Value: int64(math.MaxInt64)}})
	require.NoError(t, err)
	_, err = repo.Get(ctx, "max")
	_, ok := errors.AsType[*versioned.VersionTypeError](err)
	require.True(t, ok, "a stored MaxInt64 is not a version: %v", err)

	a := &account{ID: "max", Owner: "x", Balance: 1, Version: math.MaxInt64}
	require.ErrorIs(t, repo.Update(ctx, a), versioned.ErrInvalid)
	require.ErrorIs(t, repo.Delete(ctx, a), versioned.ErrInvalid)
	_, err = repo.Guarded(ctx, "max", nil, bson.M{"$inc": bson.M{"balance": 1}})
	require.ErrorIs(t, err, versioned.ErrInvalid)
	require.Equal(t, int64(math.MaxInt64), b.raw(t, "max")["version"], "nothing wrapped the version")
	require.Nil(t, b.raw(t, "max")["balance"], "nothing was written")

	_, err = b.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "last"}, {Key: "owner", Value: "x"}, {Key: "version", Value: int64(math.MaxInt64 - 1)}})
	require.NoError(t, err)
	last, err := repo.Get(ctx, "last")
	require.NoError(t, err)
	require.Equal(t, int64(math.MaxInt64-1), last.Version)
	last.Balance = 1
	err = repo.Update(ctx, last)
	require.ErrorIs(t, err, versioned.ErrInvalid)
	_, err = repo.Modify(ctx, "last", func(a *account) error { a.Balance = 2; return nil })
	require.ErrorIs(t, err, versioned.ErrInvalid)
	_, err = repo.Guarded(ctx, "last", nil, bson.M{"$inc": bson.M{"balance": 1}})
	require.ErrorIs(t, err, versioned.ErrInvalid)
	require.Equal(t, int64(math.MaxInt64-1), b.raw(t, "last")["version"], "no write raised the last version")
	require.Nil(t, b.raw(t, "last")["balance"], "nothing was written")
}

// TestGuardedWithCachedAnchorDoesNotWrapVersion: Guarded's anchor comes from
// what the repository saw, so it sends without reading. If another program
// has set the version to MaxInt64 since, the filter still stops the $inc.
func TestGuardedWithCachedAnchorDoesNotWrapVersion(t *testing.T) {
	repo, b := setup[account](t, nil)
	ctx := b.ctx
	require.NoError(t, repo.Insert(ctx, &account{ID: "g", Balance: 1}))
	_, err := b.coll.UpdateOne(ctx, bson.M{"_id": "g"}, bson.M{"$set": bson.M{"version": int64(math.MaxInt64)}})
	require.NoError(t, err)
	_, err = repo.Guarded(ctx, "g", nil, bson.M{"$inc": bson.M{"balance": 1}})
	require.ErrorIs(t, err, versioned.ErrInvalid)
	require.Equal(t, int64(math.MaxInt64), b.raw(t, "g")["version"])
	require.Equal(t, int64(1), b.raw(t, "g")["balance"], "the $inc did not apply")
}

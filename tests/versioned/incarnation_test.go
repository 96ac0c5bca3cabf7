package versioned_test

// A document deleted and inserted again under the same id is a new
// incarnation: a copy of the old one (same id, maybe even the same version
// number) never writes over or deletes the new one, whichever repository
// sends it and whatever it remembers.

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/versioned"
)

// deleteAndReinsert makes an ABA: the copy stale of incarnation I is read,
// then I is deleted and the id inserted again (incarnation J) by another
// repository, as another process would.
func deleteAndReinsert(t *testing.T, repo *versioned.Repo[account], b *bundle) (stale *account) {
	t.Helper()
	ctx := b.ctx
	require.NoError(t, repo.Insert(ctx, &account{ID: "ana", Owner: "ana", Balance: 100}))
	stale, err := repo.Get(ctx, "ana")
	require.NoError(t, err)
	other, err := versioned.New[account](b.coll, nil)
	require.NoError(t, err)
	cp := *stale
	require.NoError(t, other.Delete(ctx, &cp))
	require.NoError(t, other.Insert(ctx, &account{ID: "ana", Owner: "new-ana", Balance: 5}))
	return stale
}

// requireNewIncarnationIntact checks J is as inserted.
func requireNewIncarnationIntact(t *testing.T, repo *versioned.Repo[account], b *bundle, opErr error) {
	t.Helper()
	got, err := repo.Get(b.ctx, "ana")
	require.NoError(t, err, "the incarnation inserted again is still there (stale write err=%v)", opErr)
	require.Equal(t, "new-ana", got.Owner, "a stale copy of the deleted incarnation wrote over the new one (err=%v)", opErr)
	require.Equal(t, int64(5), got.Balance)
	require.ErrorIs(t, opErr, versioned.ErrConflict)
}

// TestStaleCopyUpdateFromColdRepoMissesReinsertedDocument: a caller's copy
// of incarnation I is written back by a repository that has not seen the
// document (another process, another instance behind a load balancer doing
// GET then PUT with the version) after the document was deleted and
// inserted again. The copy's version names I, so the Update matches
// nothing: a conflict, and J is untouched.
func TestStaleCopyUpdateFromColdRepoMissesReinsertedDocument(t *testing.T) {
	repo, b := setup[account](t, nil)
	stale := deleteAndReinsert(t, repo, b)
	cold, err := versioned.New[account](b.coll, nil)
	require.NoError(t, err)
	stale.Balance = 999
	err = cold.Update(b.ctx, stale)
	requireNewIncarnationIntact(t, repo, b, err)
}

// TestStaleCopyDeleteFromColdRepoMissesReinsertedDocument: the same with
// Delete: the stale copy does not delete J.
func TestStaleCopyDeleteFromColdRepoMissesReinsertedDocument(t *testing.T) {
	repo, b := setup[account](t, nil)
	stale := deleteAndReinsert(t, repo, b)
	cold, err := versioned.New[account](b.coll, nil)
	require.NoError(t, err)
	err = cold.Delete(b.ctx, stale)
	require.Equal(t, int64(1), b.count(t), "a stale copy of the deleted incarnation deleted the new one (Delete err=%v)", err)
	requireNewIncarnationIntact(t, repo, b, err)
}

// TestStaleCopyUpdateAfterCacheEvictionMissesReinsertedDocument: the same
// within one repository that saw I and has since forgotten the document, as
// it does once it has served more documents than its cache keeps (4096; a
// full cache forgets an arbitrary entry): safety never depends on the cache.
// The test empties the repository's entry the way a caller can, black-box:
// a read that finds the document gone forgets it. The repository then holds
// nothing of "ana" when J is inserted and the stale copy of I is written,
// the state an eviction leaves.
func TestStaleCopyUpdateAfterCacheEvictionMissesReinsertedDocument(t *testing.T) {
	repo, b := setup[account](t, nil)
	ctx := b.ctx
	require.NoError(t, repo.Insert(ctx, &account{ID: "ana", Owner: "ana", Balance: 100}))
	stale, err := repo.Get(ctx, "ana")
	require.NoError(t, err)
	other, err := versioned.New[account](b.coll, nil)
	require.NoError(t, err)
	cp := *stale
	require.NoError(t, other.Delete(ctx, &cp))
	_, err = repo.Get(ctx, "ana") // the repository finds I gone and forgets it
	require.ErrorIs(t, err, versioned.ErrNotFound)
	require.NoError(t, other.Insert(ctx, &account{ID: "ana", Owner: "new-ana", Balance: 5}))
	stale.Balance = 999
	err = repo.Update(ctx, stale)
	requireNewIncarnationIntact(t, repo, b, err)
}

// TestStaleCopyWarmRepoMissesReinsertedDocument: and by the repository that
// saw both incarnations, Update and Delete.
func TestStaleCopyWarmRepoMissesReinsertedDocument(t *testing.T) {
	repo, b := setup[account](t, nil)
	stale := deleteAndReinsert(t, repo, b)
	_, err := repo.Get(b.ctx, "ana") // the repository sees J
	require.NoError(t, err)
	cp := *stale
	cp.Balance = 999
	requireNewIncarnationIntact(t, repo, b, repo.Update(b.ctx, &cp))
	requireNewIncarnationIntact(t, repo, b, repo.Delete(b.ctx, stale))
}

// A Modify whose document is deleted and inserted again by another program
// (versions that start at 1, so the new one meets the old one's version)
// between its read and its write never writes the old state's change over
// the new document: its fn runs again on the new one.
func TestModifyDoesNotWriteOverAnotherIncarnationAtTheSameVersion(t *testing.T) {
	repo, b := setup[account](t, nil)
	doc := func(inc, balance int64) bson.D {
		return bson.D{{Key: "_id", Value: "x"}, {Key: "balance", Value: balance},
			{Key: "version", Value: int64(1)},
			{Key: "_mc", Value: bson.D{{Key: "inc", Value: inc}, {Key: "ids", Value: bson.A{inc}}}}}
	}
	_, err := b.coll.InsertOne(b.ctx, doc(111, 10))
	require.NoError(t, err)
	calls := 0
	got, err := repo.Modify(b.ctx, "x", func(a *account) error {
		calls++
		if calls == 1 {
			_, err := b.coll.DeleteOne(b.ctx, bson.D{{Key: "_id", Value: "x"}})
			require.NoError(t, err)
			_, err = b.coll.InsertOne(b.ctx, doc(222, 100))
			require.NoError(t, err)
		}
		a.Balance++
		return nil
	}, shortPolicy())
	require.NoError(t, err)
	require.Equal(t, 2, calls, "fn runs again on the new document")
	require.Equal(t, int64(101), got.Balance)
	require.EqualValues(t, 101, b.raw(t, "x")["balance"])
}

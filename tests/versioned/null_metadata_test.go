package versioned_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/versioned"
)

// A document another program wrote with a null list of write ids (a nil Go
// slice) is written by Update, as it is by Modify
// (TestModifyWritesADocumentWhoseWriteIDsAreNull): the write replaces the
// null with its list instead of failing on it.
func TestUpdateNeverFailsOnANullWriteIDList(t *testing.T) {
	repo, b := setup[account](t, nil)
	insertWithMeta(t, b, bson.D{{Key: "inc", Value: int64(12345)}, {Key: "ids", Value: nil}})
	doc, err := repo.Get(b.ctx, "n")
	require.NoError(t, err)
	doc.Balance++
	require.NoError(t, repo.Update(b.ctx, doc), "Update of a document whose _mc.ids is null")
	require.Equal(t, int64(8), doc.Version)
	raw := b.raw(t, "n")
	require.EqualValues(t, 2, raw["balance"])
	mc, ok := raw["_mc"].(bson.M)
	require.True(t, ok, "_mc: %v", raw["_mc"])
	require.Len(t, mc["ids"], 1)
}

// The same with a copy the repository has not seen (another process's
// repository read it): Update still writes.
func TestUpdateOfAnUnseenCopyNeverFailsOnANullWriteIDList(t *testing.T) {
	repo, b := setup[account](t, nil)
	insertWithMeta(t, b, bson.D{{Key: "inc", Value: int64(12345)}, {Key: "ids", Value: nil}})
	doc := &account{ID: "n", Balance: 2, Version: 7}
	require.NoError(t, repo.Update(b.ctx, doc), "Update of a document whose _mc.ids is null")
	require.EqualValues(t, 2, b.raw(t, "n")["balance"])
}

// A document another program wrote with a null metadata subdocument (a nil
// *struct in Go) is written by Modify, as one with a null list of write ids
// is (TestModifyWritesADocumentWhoseWriteIDsAreNull).
func TestModifyNeverFailsOnANullMetadataField(t *testing.T) {
	repo, b := setup[account](t, nil)
	insertWithMeta(t, b, nil)
	got, err := repo.Modify(b.ctx, "n", func(a *account) error { a.Balance++; return nil }, shortPolicy())
	require.NoError(t, err, "Modify of a document whose _mc is null")
	require.Equal(t, int64(2), got.Balance)
}

// Guarded on the same document: one atomic statement that writes.
func TestGuardedNeverFailsOnANullMetadataField(t *testing.T) {
	repo, b := setup[account](t, nil)
	insertWithMeta(t, b, nil)
	_, err := repo.Guarded(b.ctx, "n", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: int64(1)}}}})
	require.NoError(t, err, "Guarded on a document whose _mc is null")
}

// unfitMetadata are values of the metadata field that no write can extend:
// not a document, or a document whose list of write ids is not an array.
var unfitMetadata = []struct {
	name string
	mc   any
	inc  int64 // the incarnation id the write keeps (0: none)
}{
	{"null", nil, 0},
	{"number", int64(5), 0},
	{"string", "x", 0},
	{"empty array", bson.A{}, 0},
	{"array of documents with an incarnation", bson.A{bson.D{{Key: "inc", Value: int64(5)}, {Key: "ids", Value: bson.A{int64(9)}}}}, 0},
	{"null list", bson.D{{Key: "inc", Value: int64(12345)}, {Key: "ids", Value: nil}}, 12345},
	{"list that is a string", bson.D{{Key: "ids", Value: "x"}}, 0},
	{"list that is a document", bson.D{{Key: "inc", Value: int64(7)}, {Key: "ids", Value: bson.D{{Key: "0", Value: int64(1)}}}}, 7},
}

// Every write that records a write id (Update from a copy the repository
// read, Update from a copy it never saw, Modify, Guarded) writes a document
// whose metadata field another program left unfit, as it writes one with no
// metadata: the document's version is raised by one, the change applied
// once, and the metadata replaced by {inc (kept, if there was one), ids:
// [the write's id]}. A second write then extends the list as usual, and
// Delete of a copy read at the unfit state deletes it.
func TestEveryWriteRenewsUnfitMetadata(t *testing.T) {
	writes := []struct {
		name  string
		write func(t *testing.T, repo *versioned.Repo[account], b *bundle)
	}{
		{"update of a copy read", func(t *testing.T, repo *versioned.Repo[account], b *bundle) {
			t.Helper()
			doc, err := repo.Get(b.ctx, "n")
			require.NoError(t, err)
			doc.Balance++
			require.NoError(t, repo.Update(b.ctx, doc))
			require.Equal(t, int64(8), doc.Version)
		}},
		{"update of an unseen copy", func(t *testing.T, repo *versioned.Repo[account], b *bundle) {
			t.Helper()
			doc := &account{ID: "n", Balance: 2, Version: 7}
			require.NoError(t, repo.Update(b.ctx, doc))
			require.Equal(t, int64(8), doc.Version)
		}},
		{"modify", func(t *testing.T, repo *versioned.Repo[account], b *bundle) {
			t.Helper()
			calls := 0
			got, err := repo.Modify(b.ctx, "n", func(a *account) error { calls++; a.Balance++; return nil }, shortPolicy())
			require.NoError(t, err)
			require.Equal(t, 1, calls, "no conflict: fn runs once")
			require.Equal(t, int64(8), got.Version)
		}},
		{"guarded", func(t *testing.T, repo *versioned.Repo[account], b *bundle) {
			t.Helper()
			got, err := repo.Guarded(b.ctx, "n", bson.D{{Key: "balance", Value: int64(1)}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: int64(1)}}}})
			require.NoError(t, err)
			require.Equal(t, int64(8), got.Version)
		}},
	}
	for _, m := range unfitMetadata {
		for _, w := range writes {
			t.Run(m.name+"/"+w.name, func(t *testing.T) {
				repo, b := setup[account](t, nil)
				insertWithMeta(t, b, m.mc)
				w.write(t, repo, b)
				raw := b.raw(t, "n")
				require.EqualValues(t, 2, raw["balance"])
				require.EqualValues(t, 8, raw["version"])
				mc, ok := raw["_mc"].(bson.M)
				require.True(t, ok, "the metadata is a document again: %v", raw["_mc"])
				require.Len(t, mc["ids"], 1)
				if m.inc != 0 {
					require.Equal(t, m.inc, mc["inc"], "the incarnation id is kept")
				} else {
					require.NotContains(t, mc, "inc")
				}
				got, err := repo.Modify(b.ctx, "n", func(a *account) error { a.Balance++; return nil }, shortPolicy())
				require.NoError(t, err)
				require.Equal(t, int64(9), got.Version)
				require.Len(t, b.writeIDs(t, "n"), 2, "the next write extends the list")
			})
		}
		t.Run(m.name+"/delete", func(t *testing.T) {
			repo, b := setup[account](t, nil)
			insertWithMeta(t, b, m.mc)
			doc, err := repo.Get(b.ctx, "n")
			require.NoError(t, err)
			require.NoError(t, repo.Delete(b.ctx, doc))
			require.Zero(t, b.count(t))
		})
	}
}

// A write that read unfit metadata still pins the version it read: Modify
// whose document another program writes between its read and its write
// (raising the version, leaving the metadata unfit) runs fn again on the new
// state, and the document takes both changes, each once.
func TestModifyOfUnfitMetadataStillConflicts(t *testing.T) {
	for _, m := range unfitMetadata {
		t.Run(m.name, func(t *testing.T) {
			repo, b := setup[account](t, nil)
			insertWithMeta(t, b, m.mc)
			calls := 0
			got, err := repo.Modify(b.ctx, "n", func(a *account) error {
				calls++
				if calls == 1 {
					_, err := b.coll.UpdateOne(b.ctx, bson.D{{Key: "_id", Value: "n"}}, bson.D{
						{Key: "$inc", Value: bson.D{{Key: "balance", Value: int64(10)}, {Key: "version", Value: int64(1)}}}})
					require.NoError(t, err)
				}
				a.Balance++
				return nil
			}, shortPolicy())
			require.NoError(t, err)
			require.Equal(t, 2, calls, "fn runs again on the new state")
			require.Equal(t, int64(12), got.Balance)
			require.Equal(t, int64(9), got.Version)
			require.EqualValues(t, 12, b.raw(t, "n")["balance"])
		})
	}
}

// insertWithMeta inserts, as another program would, the document "n" at
// version 7 with balance 1 and mc as its metadata field.
func insertWithMeta(t *testing.T, b *bundle, mc any) {
	t.Helper()
	_, err := b.coll.InsertOne(b.ctx, bson.D{{Key: "_id", Value: "n"}, {Key: "balance", Value: int64(1)},
		{Key: "version", Value: int64(7)}, {Key: "_mc", Value: mc}})
	require.NoError(t, err)
}

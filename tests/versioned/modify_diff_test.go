package versioned_test

// Modify writes what fn changed, and only that: it diffs fn's result against
// the document as stored, compared as Go values, and $sets or $unsets only
// the fields fn changed or removed.

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// A fn that changes nothing writes nothing, also for a map field with
// several keys (encoded in random key order, so an unchanged map differs
// byte-wise from the stored one most of the time): the version stays.
func TestModifyWithNoChangeWritesNothing(t *testing.T) {
	repo, b := setup[account](t, nil)
	ctx := context.Background()
	attrs := map[string]string{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		attrs[k] = k
	}
	ins := &account{ID: "n", Attrs: attrs}
	require.NoError(t, repo.Insert(ctx, ins))
	for range 20 {
		_, err := repo.Modify(ctx, "n", func(*account) error { return nil })
		require.NoError(t, err)
	}
	require.Equal(t, ins.Version, b.raw(t, "n")["version"], "BUG: Modify with a no-op fn wrote the document")
}

// An omitempty field stored as its empty value ("" written by another
// service) round-trips to absent; Modify must not $unset it when fn never
// touched it.
func TestModifyKeepsUntouchedEmptyField(t *testing.T) {
	repo, b := setup[account](t, nil)
	ctx := context.Background()
	// Another service stores note: "" on the document.
	_, err := b.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "e"}, {Key: "balance", Value: int64(1)}, {Key: "note", Value: ""}, {Key: "version", Value: int64(1)}})
	require.NoError(t, err)
	_, err = repo.Modify(ctx, "e", func(a *account) error { a.Balance++; return nil })
	require.NoError(t, err)
	_, has := b.raw(t, "e")["note"]
	require.True(t, has, "BUG: Modify removed the field note, which fn never touched")
}

// Modify writes only the fields fn changed, compared as Go values: a stored
// int32 or double in an int64 field that fn did not change keeps its type.
func TestModifyKeepsTypesOfUntouchedFields(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	_, err := b.coll.InsertOne(b.ctx, bson.D{{Key: "_id", Value: "t"}, {Key: "owner", Value: "o"}, {Key: "balance", Value: int32(5)}, {Key: "version", Value: 1.0}})
	require.NoError(t, err)
	_, err = repo.Modify(b.ctx, "t", func(a *account) error { a.Owner = "p"; return nil })
	require.NoError(t, err)
	raw := b.rawBytes(t, "t")
	require.Equal(t, bson.TypeInt32, raw.Lookup("balance").Type, "balance was not retyped")
	require.Equal(t, "p", raw.Lookup("owner").StringValue())
	require.Equal(t, int64(2), raw.Lookup("version").Int64())
}

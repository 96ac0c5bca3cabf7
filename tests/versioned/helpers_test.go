package versioned_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) {
	mongotest.Main(m, mongotest.CheckLeaks())
}

// account is the model most tests use.
type account struct {
	ID      string            `bson:"_id"`
	Owner   string            `bson:"owner"`
	Balance int64             `bson:"balance"`
	Note    string            `bson:"note,omitempty"`
	Tags    []string          `bson:"tags,omitempty"`
	Attrs   map[string]string `bson:"attrs,omitempty"`
	Version int64             `bson:"version"`
}

// item is the inventory model.
type item struct {
	SKU     string `bson:"_id"`
	Stock   int64  `bson:"stock"`
	Version int64  `bson:"version"`
}

type bundle struct {
	db   *mongotest.DB
	coll *mongo.Collection
	ctx  context.Context
}

// setup returns a fresh database, a collection in it, and a repository of T
// over that collection.
func setup[T any](t testing.TB, opts *versioned.Options) (*versioned.Repo[T], *bundle) {
	t.Helper()
	db := mongotest.New(t)
	coll := db.Collection("docs")
	repo, err := versioned.New[T](coll, opts)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return repo, &bundle{db: db, coll: coll, ctx: ctx}
}

// raw reads a stored document as it is, bypassing the repository.
func (b *bundle) raw(t testing.TB, id any) bson.M {
	t.Helper()
	dec := bson.NewDecoder(bson.NewDocumentReader(bytes.NewReader(b.rawBytes(t, id))))
	dec.DefaultDocumentM()
	var m bson.M
	require.NoError(t, dec.Decode(&m))
	return m
}

// rawBytes reads a stored document's bytes, to compare before and after.
func (b *bundle) rawBytes(t testing.TB, id any) bson.Raw {
	t.Helper()
	raw, err := b.coll.FindOne(b.ctx, bson.M{"_id": id}).Raw()
	require.NoError(t, err)
	return raw
}

// count returns the number of documents in the collection.
func (b *bundle) count(t testing.TB) int64 {
	t.Helper()
	n, err := b.coll.CountDocuments(b.ctx, bson.M{})
	require.NoError(t, err)
	return n
}

// writeIDs returns the write ids a stored document carries, oldest first.
func (b *bundle) writeIDs(t testing.TB, id any) bson.A {
	t.Helper()
	m := b.raw(t, id)
	mc, ok := m["_mc"].(bson.M)
	if !ok {
		return nil
	}
	w, _ := mc["ids"].(bson.A)
	return w
}

// requireSlice skips the test on a server that ignores $push's $slice
// (FerretDB v1): there a write that does not know the list it appends to
// (a cold Update, a Guarded from a stale view) is not cut on the server, and
// the list passes WriteIDs until a write that sets the exact list cuts it
// (TestFootprintAfterMixedWritesIsAtMost256Bytes runs there). The test runs
// on every server that has $slice (MongoDB, DocumentDB). Correctness does not
// depend on $slice; the exact bound does (see DESIGN.md).
func requireSlice(t *testing.T, b *bundle) {
	t.Helper()
	if !sliceWorks(t, b) {
		t.Skip("the server ignores $slice in $push (FerretDB v1): a write that does not know the list may pass the bound until an exact write cuts it; run with MONGODB_URI")
	}
}

func sliceWorks(t *testing.T, b *bundle) bool {
	t.Helper()
	coll := b.db.Collection("slice_probe")
	_, err := coll.InsertOne(b.ctx, bson.D{{Key: "_id", Value: 1}, {Key: "a", Value: bson.A{1, 2}}})
	require.NoError(t, err)
	_, err = coll.UpdateOne(b.ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$push", Value: bson.D{{Key: "a", Value: bson.D{
		{Key: "$each", Value: bson.A{3}}, {Key: "$slice", Value: -2},
	}}}}})
	require.NoError(t, err)
	var d struct {
		A []int `bson:"a"`
	}
	require.NoError(t, coll.FindOne(b.ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&d))
	return len(d.A) == 2
}

package versioned_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// oldProtocolDoc stores a document as the library's string-id protocol
// (never released) left it: _mc.inc and _mc.ids are 26-character strings.
func oldProtocolDoc(t *testing.T, b *bundle, id string) {
	t.Helper()
	_, err := b.coll.InsertOne(b.ctx, bson.D{
		{Key: "_id", Value: id}, {Key: "owner", Value: id}, {Key: "balance", Value: int64(10)},
		{Key: "version", Value: int64(3)},
		{Key: "_mc", Value: bson.D{
			{Key: "inc", Value: "01JD5Z1QK8Y4W3V2T1S0R9Q8P7"},
			{Key: "h", Value: int32(32)},
			{Key: "ids", Value: bson.A{"01JD5Z1QK8Y4W3V2T1S0R9Q8P7", "01JD5Z2AAAAAAAAAAAAAAAAAAA", "01JD5Z3BBBBBBBBBBBBBBBBBBB"}},
		}},
	})
	require.NoError(t, err)
}

func shortPolicy() versioned.WriteOption {
	return versioned.WithRetry(retry.Policy{MaxElapsedTime: 2 * time.Second})
}

// TestGuardedAfterAbortedTransactionSucceeds: a Guarded write inside a
// transaction that then aborts leaves the repository's cache at a version
// no committed write made (DESIGN.md says so, and that its anchor then
// matches nothing). A later Guarded outside the transaction, with no other
// writer at all and a cond that holds, must re-read and succeed, not spin
// on the phantom anchor until MaxElapsedTime and return *ConflictError.
//
// The embedded server has no transactions (txnClient simulates them without
// rollback), so the abort's rollback is done by restoring the document as
// it was before the transaction: the state a real abort leaves.
func TestGuardedAfterAbortedTransactionSucceeds(t *testing.T) {
	_, b := setup[item](t, nil)
	ctx := b.ctx
	seed, err := versioned.New[item](b.coll, nil)
	require.NoError(t, err)
	require.NoError(t, seed.Insert(ctx, &item{SKU: "sku", Stock: 10}))
	before := b.rawBytes(t, "sku")

	client := txnClient(t, b)
	repo, err := versioned.New[item](client.Database(b.db.Name()).Collection(b.coll.Name()), nil)
	require.NoError(t, err)
	dec := bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -1}}}}

	sess, err := client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	require.NoError(t, sess.StartTransaction())
	_, err = repo.Guarded(mongo.NewSessionContext(ctx, sess), "sku", nil, dec)
	require.NoError(t, err)
	require.NoError(t, sess.AbortTransaction(ctx))
	if !b.db.Caps().Transactions || !commits(t, b) { // simulated: roll back by hand
		_, err = b.coll.ReplaceOne(ctx, bson.M{"_id": "sku"}, before)
		require.NoError(t, err)
	}
	require.Equal(t, before, b.rawBytes(t, "sku"), "the abort left the document as it was")

	got, err := repo.Guarded(ctx, "sku", nil, dec, shortPolicy())
	require.NoError(t, err, "no other writer, no cond: Guarded must apply")
	require.Equal(t, int64(9), got.Stock)
}

type oddInner struct {
	A string         `bson:"a"`
	M map[string]any `bson:"m,omitempty"`
}

type oddDoc struct {
	ID      string    `bson:"_id"`
	Spaced  string    `bson:"with space é"`
	Dollar  string    `bson:"d"`
	Inner   *oddInner `bson:"inner,omitempty"`
	List    []any     `bson:"list,omitempty"`
	Gone    string    `bson:"gone,omitempty"`
	Version int64     `bson:"version"`
}

// TestModifyPipelineWritesOddValuesExactly: the byte-built pipeline form of
// Modify's write (DocumentDB, MongoDB) stores exactly what fn left: field
// names with spaces and non-ASCII, strings that look like field paths or
// variables, nested documents whose keys are empty or odd, arrays of
// documents, and a removed field.
func TestModifyPipelineWritesOddValuesExactly(t *testing.T) {
	repo, b := setup[oddDoc](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &oddDoc{ID: "x", Spaced: "s", Dollar: "d", Gone: "here",
		Inner: &oddInner{A: "old", M: map[string]any{"k": int32(1)}}}))
	want := oddDoc{ID: "x", Spaced: "$$REMOVE", Dollar: "$version",
		Inner: &oddInner{A: "$_mc.ids", M: map[string]any{"": "empty", "sp ace": bson.D{{Key: "$$ROOT", Value: 1}}[0].Key}},
		List:  []any{bson.D{{Key: "z", Value: "$$NOW"}}, "$literal"}}
	got, err := repo.Modify(b.ctx, "x", func(d *oddDoc) error {
		v := d.Version
		*d = want
		d.Version = v
		return nil
	})
	require.NoError(t, err)
	stored, err := repo.Get(b.ctx, "x")
	require.NoError(t, err)
	want.Version = got.Version
	require.Equal(t, want, *stored)
	_, ok := b.raw(t, "x")["gone"]
	require.False(t, ok, "the removed field is gone")
}

// TestGuardedWithRepeatedOperatorRaisesVersionByOne: an update that names
// an operator twice (a bson.D may: {$inc: {a: 1}}, {$inc: {b: 1}}) either
// is refused as an *InvalidError, nothing sent, or raises the version by
// exactly one and records one write id (invariant L: one version, one id).
func TestGuardedWithRepeatedOperatorRaisesVersionByOne(t *testing.T) {
	repo, b := setup[account](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &account{ID: "a", Balance: 1}))
	before, err := repo.Get(b.ctx, "a")
	require.NoError(t, err)
	ids := len(b.writeIDs(t, "a"))
	got, err := repo.Guarded(b.ctx, "a", nil, bson.D{
		{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}},
		{Key: "$inc", Value: bson.D{{Key: "other", Value: 1}}},
	})
	t.Logf("Guarded with $inc twice: err=%v", err)
	if err != nil {
		require.ErrorIs(t, err, versioned.ErrInvalid, "a refusal is an *InvalidError")
		after, gerr := repo.Get(b.ctx, "a")
		require.NoError(t, gerr)
		require.Equal(t, before.Version, after.Version, "refused: nothing written")
		return
	}
	require.Equal(t, before.Version+1, got.Version, "one write, one version")
	require.Len(t, b.writeIDs(t, "a"), ids+1, "one write, one id")
	raw := b.raw(t, "a")
	require.EqualValues(t, 2, raw["balance"], "the first $inc applied")
	require.EqualValues(t, 1, raw["other"], "the second $inc applied")
}

// TestGuardedGateBoundsInFlightAndReleasesOnCancel: at most WriteIDs/4
// Guarded writes per document and client are in flight; a call whose ctx
// ends while it waits returns the context's error having sent nothing, and
// leaves no slot taken: every later call still goes through.
func TestGuardedGateBoundsInFlightAndReleasesOnCancel(t *testing.T) {
	repo, f, b := setupFaulty[item](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &item{SKU: "sku", Stock: 100}))
	_, err := repo.Get(b.ctx, "sku") // warm: Guarded sends at once
	require.NoError(t, err)
	slots := versioned.WriteIDs / 4
	var arrived atomic.Int64
	writes := mongotest.Writes(b.coll.Name())
	stop := f.DelayReplies(time.Minute, func(c *mongotest.Command) bool {
		if !writes(c) {
			return false
		}
		arrived.Add(1)
		return true
	})
	dec := bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -1}}}}
	var wg sync.WaitGroup
	errs := make(chan error, slots+2)
	for range slots + 2 {
		wg.Go(func() {
			_, err := repo.Guarded(b.ctx, "sku", nil, dec)
			errs <- err
		})
	}
	require.Eventually(t, func() bool { return arrived.Load() >= int64(slots) }, 30*time.Second, 5*time.Millisecond)
	// The others wait at the gate: a waiter whose ctx ends returns at once.
	ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
	_, err = repo.Guarded(ctx, "sku", nil, dec)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, int64(slots), arrived.Load(), "no more than WriteIDs/4 writes in flight")
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	got, err := repo.Guarded(b.ctx, "sku", nil, dec)
	require.NoError(t, err)
	require.Equal(t, int64(100-slots-2-1), got.Stock, "the cancelled call wrote nothing; every other applied once")
}

// TestWritesToDocumentWithoutMetadataKeepL: a document another program
// inserted (no version, no _mc) is written by Modify (both forms), Guarded
// and Update in turn: each raises the version by one and lists its id last.
func TestWritesToDocumentWithoutMetadataKeepL(t *testing.T) {
	repo, b := setup[account](t, nil)
	_, err := b.coll.InsertOne(b.ctx, bson.D{{Key: "_id", Value: "f"}, {Key: "balance", Value: int64(1)}})
	require.NoError(t, err)
	got, err := repo.Modify(b.ctx, "f", func(a *account) error { a.Balance++; return nil })
	require.NoError(t, err)
	require.Equal(t, int64(1), got.Version)
	got, err = repo.Guarded(b.ctx, "f", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
	require.NoError(t, err)
	require.Equal(t, int64(2), got.Version)
	got.Balance++
	require.NoError(t, repo.Update(b.ctx, got))
	require.Equal(t, int64(3), got.Version)
	got, err = repo.Modify(b.ctx, "f", func(a *account) error { a.Balance++; return nil })
	require.NoError(t, err)
	require.Equal(t, int64(4), got.Version)
	require.Equal(t, int64(5), got.Balance)
	require.Len(t, b.writeIDs(t, "f"), 4)
}

// TestLostReplyGuardedOnFullListAppliesOnce: with the list of write ids
// full (on FerretDB v1 the Guarded write then pins the version and $sets
// the exact list), a lost reply, while another process writes meanwhile, is
// settled: the decrement applies exactly once and the list stays at
// WriteIDs.
func TestLostReplyGuardedOnFullListAppliesOnce(t *testing.T) {
	repo, f, b := setupFaulty[item](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &item{SKU: "s", Stock: 100}))
	dec := bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -1}}}}
	for range versioned.WriteIDs {
		_, err := repo.Guarded(b.ctx, "s", nil, dec)
		require.NoError(t, err)
	}
	other, err := versioned.New[item](b.coll, nil)
	require.NoError(t, err)
	fault := dropWriteAfter(f, b, func() {
		_, err := other.Guarded(b.ctx, "s", nil, dec)
		require.NoError(t, err)
	})
	_, err = repo.Guarded(b.ctx, "s", nil, dec)
	require.NoError(t, err)
	requireDropped(t, fault)
	m := b.raw(t, "s")
	require.EqualValues(t, 100-versioned.WriteIDs-2, m["stock"], "each decrement applied exactly once")
	require.Len(t, b.writeIDs(t, "s"), versioned.WriteIDs, "every write knew the full list: it stays at WriteIDs")
}

// TestForeignIncarnationIsATypedError: an incarnation that is not a
// non-zero integer (a string of the string-id protocol, or an int64 a
// relaxed-JSON tool rewrote as an inexact double) is refused with a
// *VersionTypeError matching ErrInvalid by every write, and nothing is
// written; one rewritten as an exact double is read as the number it is.
func TestForeignIncarnationIsATypedError(t *testing.T) {
	repo, b := setup[account](t, nil)
	oldProtocolDoc(t, b, "old")
	before := b.raw(t, "old")
	_, err := repo.Modify(b.ctx, "old", func(a *account) error { a.Balance++; return nil }, shortPolicy())
	var vt *versioned.VersionTypeError
	require.ErrorAs(t, err, &vt)
	require.ErrorIs(t, err, versioned.ErrInvalid)
	require.Equal(t, "_mc.inc", vt.Field)
	_, err = repo.Guarded(b.ctx, "old", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}}, shortPolicy())
	require.ErrorAs(t, err, &vt)
	_, err = repo.Get(b.ctx, "old")
	require.ErrorAs(t, err, &vt)
	require.Equal(t, before, b.raw(t, "old"), "nothing written")

	require.NoError(t, repo.Insert(b.ctx, &account{ID: "js", Balance: 1}))
	_, err = b.coll.UpdateOne(b.ctx, bson.M{"_id": "js"}, bson.M{"$set": bson.M{"_mc.inc": float64(12345)}})
	require.NoError(t, err)
	fresh, err := versioned.New[account](b.coll, nil)
	require.NoError(t, err)
	got, err := fresh.Modify(b.ctx, "js", func(a *account) error { a.Balance++; return nil }, shortPolicy())
	require.NoError(t, err)
	require.Equal(t, int64(2), got.Balance)
}

// A document another program wrote with a null list of write ids (a nil Go
// slice) is written by Modify, which replaces the null with its list.
func TestModifyWritesADocumentWhoseWriteIDsAreNull(t *testing.T) {
	repo, b := setup[account](t, nil)
	insertWithMeta(t, b, bson.D{{Key: "inc", Value: int64(12345)}, {Key: "ids", Value: nil}})
	got, err := repo.Modify(b.ctx, "n", func(a *account) error { a.Balance++; return nil }, shortPolicy())
	require.NoError(t, err)
	require.Equal(t, int64(2), got.Balance)
	require.Equal(t, int64(8), got.Version)
	mc, ok := b.raw(t, "n")["_mc"].(bson.M)
	require.True(t, ok, "_mc is a document")
	require.Len(t, mc["ids"], 1)
}

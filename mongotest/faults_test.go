package mongotest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

type counter struct {
	ID      int   `bson:"_id"`
	N       int64 `bson:"n"`
	Version int64 `bson:"v"`
}

// seedCounter inserts {_id: 1, n: 0, v: 0} into collection c through the
// shared client.
func seedCounter(t *testing.T, db *mongotest.DB) {
	t.Helper()
	_, err := db.Collection("c").InsertOne(context.Background(), counter{ID: 1})
	require.NoError(t, err)
}

func readCounter(t *testing.T, db *mongotest.DB) counter {
	t.Helper()
	var c counter
	require.NoError(t, db.Collection("c").FindOne(context.Background(), bson.D{{Key: "_id", Value: 1}}).Decode(&c))
	return c
}

var incN = bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: int64(1)}, {Key: "v", Value: int64(1)}}}}

// TestFaultWriteConcernError: the server applied the update; the client
// sees a WriteException carrying exactly the injected writeConcernError and
// labels, which store classifies as ambiguous.
func TestFaultWriteConcernError(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	seedCounter(t, db)

	wce := mongotest.WriteConcernError{
		Code: 189, CodeName: "PrimarySteppedDown", Errmsg: "stepped down while waiting",
		ErrInfo:     bson.D{{Key: "writeConcern", Value: bson.D{{Key: "w", Value: "majority"}}}},
		ErrorLabels: []string{"RetryableWriteError"},
	}
	fault := f.WriteConcernErrorNext(mongotest.Writes("c"), wce)
	_, err := f.Collection("c").UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, incN)
	var we mongo.WriteException
	require.ErrorAs(t, err, &we)
	require.NotNil(t, we.WriteConcernError, "got %v", err)
	require.Equal(t, 189, we.WriteConcernError.Code)
	require.Equal(t, "PrimarySteppedDown", we.WriteConcernError.Name)
	require.Equal(t, "stepped down while waiting", we.WriteConcernError.Message)
	require.Equal(t, "majority", we.WriteConcernError.Details.Lookup("writeConcern", "w").StringValue())
	require.True(t, we.HasErrorLabel("RetryableWriteError"))
	require.True(t, store.IsAmbiguous(err))
	require.True(t, fault.HasFired())
	require.Len(t, fault.Matched(), 1)
	require.Equal(t, "update", fault.Matched()[0].Name)
	require.Equal(t, int64(1), readCounter(t, db).N, "the write behind the writeConcernError must be applied")

	// findAndModify too, with the canned wtimeout and no labels.
	f.WriteConcernErrorNext(mongotest.Writes("c"), mongotest.WriteConcernTimeout())
	err = f.Collection("c").FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: 1}}, incN).Err()
	require.Error(t, err)
	var wcErr interface{ HasErrorLabel(string) bool }
	require.ErrorAs(t, err, &wcErr)
	require.False(t, wcErr.HasErrorLabel("RetryableWriteError"))
	require.True(t, store.IsAmbiguous(err), "got %T %v", err, err)
	require.ErrorContains(t, err, "waiting for replication timed out")
	require.Equal(t, int64(2), readCounter(t, db).N)

	// One-shot: the next write succeeds.
	_, err = f.Collection("c").UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, incN)
	require.NoError(t, err)
	require.Equal(t, int64(3), readCounter(t, db).N)
}

// TestFaultErrorAfterApply: the write is in the database; the client sees
// NotWritablePrimary labelled RetryableWriteError.
func TestFaultErrorAfterApply(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	seedCounter(t, db)

	fault := f.ErrorAfterApply(mongotest.Writes("c"), mongotest.NotWritablePrimary())
	_, err := f.Collection("c").UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, incN)
	var ce mongo.CommandError
	require.ErrorAs(t, err, &ce, "got %T %v", err, err)
	require.Equal(t, int32(10107), ce.Code)
	require.Equal(t, "NotWritablePrimary", ce.Name)
	require.True(t, ce.HasErrorLabel("RetryableWriteError"))
	require.True(t, store.IsAmbiguous(err))
	require.True(t, fault.HasFired())
	require.Equal(t, int64(1), readCounter(t, db).N, "the server applied the write")

	_, err = f.Collection("c").UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, incN)
	require.NoError(t, err, "one-shot")
	require.Equal(t, int64(2), readCounter(t, db).N)
}

// TestFaultErrorBeforeApply: the server never saw the write; the client
// sees the injected error.
func TestFaultErrorBeforeApply(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	seedCounter(t, db)

	e := mongotest.ServerError{Code: 91, CodeName: "ShutdownInProgress"}
	fault := f.ErrorBeforeApply(mongotest.Commands([]string{"findAndModify"}, "c"), e)
	// A command the fault does not match passes.
	_, err := f.Collection("c").UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, incN)
	require.NoError(t, err)
	require.False(t, fault.HasFired())

	err = f.Collection("c").FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: 1}}, incN).Err()
	var ce mongo.CommandError
	require.ErrorAs(t, err, &ce, "got %T %v", err, err)
	require.Equal(t, int32(91), ce.Code)
	require.Equal(t, "mongotest: injected ShutdownInProgress", ce.Message)
	require.False(t, ce.HasErrorLabel("RetryableWriteError"))
	require.True(t, fault.HasFired())
	require.Equal(t, int64(1), readCounter(t, db).N, "the refused write must not reach the server")
}

// TestFaultLateCopy: a held update reaches the server only when the test
// delivers it, after the client re-sent it: two copies of a blind $inc both
// apply (so both reached the server), and the late copy of a conditional
// update matches nothing, which its reply shows.
func TestFaultLateCopy(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	seedCounter(t, db)
	coll := f.Collection("c")
	byID := bson.D{{Key: "_id", Value: 1}}

	fault := f.HoldNext(mongotest.Writes("c"))
	_, err := fault.Deliver(ctx)
	require.ErrorIs(t, err, mongotest.ErrNothingHeld, "nothing is held before the fault fires")
	_, err = coll.UpdateOne(ctx, byID, incN)
	require.True(t, store.IsNetwork(err), "want a network error, got %v", err)
	require.True(t, store.IsAmbiguous(err))
	require.True(t, fault.HasFired())
	require.Zero(t, readCounter(t, db).N, "the held copy must not have reached the server yet")

	_, err = coll.UpdateOne(ctx, byID, incN) // the client's resend
	require.NoError(t, err)
	require.Equal(t, int64(1), readCounter(t, db).N)

	reply, err := fault.Deliver(ctx)
	require.NoError(t, err)
	require.Equal(t, int32(1), reply.Lookup("n").Int32(), "reply %v", reply)
	require.Equal(t, int64(2), readCounter(t, db).N, "the late copy reached the server and applied")
	require.Equal(t, []bson.Raw{reply}, fault.Delivered())
	_, err = fault.Deliver(ctx)
	require.ErrorIs(t, err, mongotest.ErrNothingHeld, "a copy is delivered once")

	// A conditional write: at most one copy applies.
	cas := bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: int64(2)}}
	fault = f.HoldNext(mongotest.Writes("c"))
	_, err = coll.UpdateOne(ctx, cas, incN)
	require.True(t, store.IsNetwork(err), "got %v", err)
	res, err := coll.UpdateOne(ctx, cas, incN)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.ModifiedCount)
	reply, err = fault.Deliver(ctx)
	require.NoError(t, err)
	require.Equal(t, int32(0), reply.Lookup("n").Int32(), "the late copy's filter must no longer match: reply %v", reply)
	got := readCounter(t, db)
	require.Equal(t, int64(3), got.N)
	require.Equal(t, int64(3), got.Version)
	require.Len(t, fault.Matched(), 1)
	require.Equal(t, "update", fault.Matched()[0].Name)
}

// TestFaultLateCopyAfterClose: the held copy outlives the client and its
// proxy; it is delivered all the same.
func TestFaultLateCopyAfterClose(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	f, err := db.OpenFaulty(ctx, nil)
	require.NoError(t, err)
	seedCounter(t, db)
	fault := f.HoldNext(mongotest.Writes("c"))
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = f.Collection("c").UpdateOne(short, bson.D{{Key: "_id", Value: 1}}, incN)
	cancel()
	require.True(t, store.IsAmbiguous(err), "got %v", err)
	f.Close()
	require.NoError(t, f.Err())
	reply, err := fault.Deliver(ctx)
	require.NoError(t, err)
	require.Equal(t, int32(1), reply.Lookup("n").Int32())
	require.Equal(t, int64(1), readCounter(t, db).N)
}

// TestUnacknowledgedWritesThroughProxy: w:0 writes (OP_MSG with moreToCome)
// pass the proxy as one serialized exchange each: a read on the same
// connection right after sees every one, no stray reply reaches the
// client, and the proxy refused nothing.
func TestUnacknowledgedWritesThroughProxy(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, &mongotest.FaultyOptions{ClientOptions: options.Client().SetMaxPoolSize(1)})
	ctx := context.Background()
	w0 := f.Collection("u", options.Collection().SetWriteConcern(writeconcern.Unacknowledged()))
	const n = 50
	for i := range n {
		res, err := w0.InsertOne(ctx, bson.D{{Key: "_id", Value: i}})
		require.NoError(t, err)
		require.False(t, res.Acknowledged)
	}
	count, err := f.Collection("u").CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(n), count)
	require.NoError(t, f.Err())
}

// TestFaultsMatchOnlyTheirCommand: every fault kind lets other commands
// pass untouched and acts once.
func TestFaultsMatchOnlyTheirCommand(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	seedCounter(t, db)
	m := mongotest.Writes("c")
	faults := []*mongotest.Fault{
		f.WriteConcernErrorNext(m, mongotest.WriteConcernTimeout()),
		f.ErrorAfterApply(m, mongotest.NotWritablePrimary()),
		f.ErrorBeforeApply(m, mongotest.NotWritablePrimary()),
		f.HoldNext(m),
	}
	require.NoError(t, f.Collection("c").FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Err())
	_, err := f.Collection("other").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)
	for _, fl := range faults {
		require.False(t, fl.HasFired())
	}
	// Faults that act before forwarding (ErrorBeforeApply, HoldNext) act
	// first; then those on the reply, in the order they were armed; each once.
	order := []int{2, 3, 0, 1}
	for k, i := range order {
		_, err := f.Collection("c").UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, incN)
		require.Error(t, err, "fault %d", i)
		require.True(t, faults[i].HasFired(), "fault %d", i)
		for _, later := range order[k+1:] {
			require.False(t, faults[later].HasFired(), "fault %d fired before its turn", later)
		}
	}
	_, err = f.Collection("c").UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, incN)
	require.NoError(t, err)
	// Applied: the write-concern one, the after-apply one and the last;
	// not the refused one, not the held one.
	require.Equal(t, int64(3), readCounter(t, db).N)
	_, err = faults[3].Deliver(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(4), readCounter(t, db).N)
	require.NoError(t, f.Err())
}

// TestFaultAnswerInstead: an update answered without reaching the server
// reports what the fault says, changes nothing, and acts n times only.
func TestFaultAnswerInstead(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	seedCounter(t, db)
	ack, err := bson.Marshal(bson.D{{Key: "n", Value: 1}, {Key: "nModified", Value: 1}, {Key: "ok", Value: 1.0}})
	require.NoError(t, err)
	fault := f.AnswerInstead(2, mongotest.Commands([]string{"update"}, "c"), ack)
	for range 2 {
		res, err := f.Collection("c").UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, incN)
		require.NoError(t, err)
		require.Equal(t, int64(1), res.ModifiedCount, "the lie")
	}
	require.True(t, fault.HasFired())
	require.Zero(t, readCounter(t, db).N, "acknowledged, never applied")
	_, err = f.Collection("c").UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, incN)
	require.NoError(t, err)
	require.Equal(t, int64(1), readCounter(t, db).N, "the third update, past the fault, applies")
}

// TestFaultRewriteReplies: the client gets the reply the rewrite makes of
// the server's, for n replies; the request itself reached the server.
func TestFaultRewriteReplies(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	seedCounter(t, db)
	old, err := bson.Marshal(bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: bson.A{counter{ID: 1, N: 41}}},
		{Key: "id", Value: int64(0)}, {Key: "ns", Value: db.Name() + ".c"}}}, {Key: "ok", Value: 1.0}})
	require.NoError(t, err)
	seen, served := 0, 0 // rewrites, and how many documents the server's replies held
	fault := f.RewriteReplies(1, mongotest.Commands([]string{"find"}, "c"), func(_ *mongotest.Command, reply bson.Raw) (bson.Raw, error) {
		seen++
		docs, _ := reply.Lookup("cursor", "firstBatch").Array().Values()
		served += len(docs)
		return old, nil
	})
	var c counter
	require.NoError(t, f.Collection("c").FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&c))
	require.Equal(t, int64(41), c.N, "the rewritten (stale) reply")
	require.True(t, fault.HasFired())
	require.NoError(t, f.Collection("c").FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&c))
	require.Zero(t, c.N, "the next reply is the server's")
	require.Equal(t, 1, seen)
	require.Equal(t, 1, served, "the rewrite saw the server's own reply")
}

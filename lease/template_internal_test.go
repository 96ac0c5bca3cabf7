package lease

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/store"
)

// TestEstimatedClaimTemplate: the claim's filter clause and update, written
// into a copy of the Manager's template, are what the driver marshals from
// the documents they stand for, even with an owner that holds the
// placeholders' bytes.
func TestEstimatedClaimTemplate(t *testing.T) {
	// A client that never connects: nothing here does I/O.
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	owner := "o$wner" + string(binary.LittleEndian.AppendUint64(nil, 0x6c_6561_7365_0002)) + "\x00lease.claim"
	m, err := New(client.Database("d").Collection("c"), &Options{Owner: owner, TTL: time.Minute, Mode: ModeEstimated, Field: "lease:claim"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 10, 0, 0, 123_456_789, time.UTC)
	a := attempt{claim: bson.NewObjectID(), est: store.Estimate{Time: now, Bound: time.Millisecond}}
	filter, update := m.claimOp(docKey{ID: bson.RawValue{Type: bson.TypeString, Value: bsonString("x")}}, a)

	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"filter", filter[len(filter)-1:], bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: m.pOwner, Value: nil}},
			bson.D{{Key: m.pExpires, Value: bson.D{{Key: "$lt", Value: now.Add(-time.Millisecond).Truncate(time.Millisecond)}}}},
		}}}},
		{"update", update, bson.D{
			{Key: "$set", Value: bson.D{
				{Key: m.pOwner, Value: owner},
				{Key: m.pExpires, Value: now.Add(time.Minute)},
				{Key: m.pAcquired, Value: now},
				{Key: m.pClaim, Value: a.claim},
				{Key: m.pFirst, Value: now.Add(time.Millisecond).UnixMicro() + 1},
			}},
			{Key: "$inc", Value: bson.D{{Key: m.pEpoch, Value: int64(1)}}},
		}},
	} {
		got, err := bson.Marshal(c.got)
		if err != nil {
			t.Fatal(err)
		}
		want, err := bson.Marshal(c.want)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: got %v, want %v", c.what, bson.Raw(got), bson.Raw(want))
		}
	}
}

func bsonString(s string) []byte {
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(s)+1)), append([]byte(s), 0)...) //nolint:gosec // a short string
}

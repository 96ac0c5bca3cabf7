package lease

import (
	"bytes"
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/store"
)

// TestEstimatedClaimEncoding: the claim's filter clause and update built as
// bytes are what the driver marshals from the documents they stand for.
func TestEstimatedClaimEncoding(t *testing.T) {
	// A client that never connects: nothing here does I/O.
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	m, err := New(client.Database("d").Collection("c"), &Options{Owner: "o$wner", TTL: time.Minute, Mode: ModeEstimated})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 10, 0, 0, 123_456_789, time.UTC)
	a := attempt{claim: bson.NewObjectID(), est: store.Estimate{Time: now}}

	want, err := bson.Marshal(bson.D{{Key: "a", Value: bson.A{
		bson.D{{Key: m.pOwner, Value: nil}},
		bson.D{{Key: m.pExpires, Value: bson.D{{Key: "$lt", Value: now.Truncate(time.Millisecond)}}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := bson.Marshal(bson.D{{Key: "a", Value: bson.RawValue{Type: bson.TypeArray, Value: m.freeOrExpired(now)}}})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("filter: got %v, want %v", bson.Raw(got), bson.Raw(want))
	}

	want, err = bson.Marshal(bson.D{
		{Key: "$set", Value: bson.D{
			{Key: m.pOwner, Value: m.c.owner},
			{Key: m.pExpires, Value: a.est.Time.Add(m.c.ttl).Truncate(time.Millisecond)},
			{Key: m.pAcquired, Value: a.est.Time.Truncate(time.Millisecond)},
			{Key: m.pClaim, Value: a.claim},
		}},
		{Key: "$inc", Value: bson.D{{Key: m.pEpoch, Value: int64(1)}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.estimatedUpdate(a); !bytes.Equal(got, want) {
		t.Fatalf("update: got %v, want %v", got, bson.Raw(want))
	}
}

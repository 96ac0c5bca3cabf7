package mongotest_test

import (
	"context"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

// In a test, one line gives a fresh database on a real server, dropped when
// the test ends.
func TestExampleUsage(t *testing.T) {
	db := mongotest.New(t)
	_, err := db.Collection("orders").InsertOne(context.Background(), bson.D{{Key: "qty", Value: 3}})
	if err != nil {
		t.Fatal(err)
	}
}

// Outside a test (an example, a demo), Open gives the same fresh database and
// the function that drops it.
func ExampleOpen() {
	ctx := context.Background()
	db, drop, err := mongotest.Open(ctx, "example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = drop(ctx) }()

	_, err = db.Collection("orders").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "qty", Value: 3}})
	if err != nil {
		fmt.Println(err)
		return
	}
	n, err := db.Collection("orders").CountDocuments(ctx, bson.D{})
	fmt.Println(n, err)
	// Output: 1 <nil>
}

// A dropped reply is the ambiguous write that exactly-once code must handle:
// the server applied the insert, the client saw a network error.
func ExampleFaulty_DropNextReply() {
	ctx := context.Background()
	db, drop, err := mongotest.Open(ctx, "example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = drop(ctx) }()
	f, err := db.OpenFaulty(ctx, nil) // in a test: f := db.Faulty(t, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer f.Close()

	fault := f.DropNextReply(mongotest.Writes("payments"))
	_, err = f.Collection("payments").InsertOne(ctx, bson.D{{Key: "_id", Value: "p1"}})
	applied := db.Collection("payments").FindOne(ctx, bson.D{{Key: "_id", Value: "p1"}}).Err() == nil
	fmt.Println("fired:", fault.HasFired(), "applied:", applied, "client saw ambiguous error:", store.IsAmbiguous(err))
	// Output: fired: true applied: true client saw ambiguous error: true
}

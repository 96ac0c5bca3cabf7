package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/mongocas/mongocas/store"
)

// Connect needs a server: the example connects to MONGODB_URI and returns
// when it is not set.
func ExampleConnect() {
	uri := os.Getenv("MONGODB_URI")
	if uri == "" {
		return
	}
	ctx := context.Background()
	s, err := store.Connect(ctx, uri, nil) // a *store.Store, not a bare client
	var cerr *store.ConnectError
	if errors.As(err, &cerr) {
		fmt.Println(err) // names the URI with its password redacted
		return
	}
	defer s.Close(ctx)
	items := s.Database("shop").Collection("items") // or s.Client() for the *mongo.Client
	fmt.Println(items.Name())
}

func ExampleServer_Capabilities() {
	uri := os.Getenv("MONGODB_URI")
	if uri == "" {
		return
	}
	ctx := context.Background()
	s, err := store.Connect(ctx, uri, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close(ctx)
	caps, err := s.Server().Capabilities(ctx, s.Database("shop"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(caps.Server, caps.Topology, "transactions:", caps.Transactions)
}

// IsAmbiguous tells a write that may have been applied (a network error, a
// timeout, a write-concern error) from one that was not: after an
// ambiguous error, re-read before sending the write again. It looks at
// types, codes and labels through errors.As, so wrapping keeps it working.
func ExampleIsAmbiguous() {
	uri := os.Getenv("MONGODB_URI")
	if uri == "" {
		return
	}
	ctx := context.Background()
	s, err := store.Connect(ctx, uri, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close(ctx)
	_, err = s.Database("shop").Collection("payments").InsertOne(ctx, map[string]any{"_id": "p1"})
	switch {
	case err == nil:
		fmt.Println("stored")
	case store.IsDuplicateKey(err):
		fmt.Println("stored before")
	case store.IsAmbiguous(fmt.Errorf("save p1: %w", err)):
		fmt.Println("maybe stored: read p1 before trying again")
	default:
		fmt.Println("not stored:", err)
	}
}

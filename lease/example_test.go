package lease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/store"
)

// The examples need a server: they connect to MONGODB_URI and return when
// it is not set. The leased document must exist.
func ExampleNew() {
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

	// New returns the Manager and an error (an *lease.OptionsError for bad
	// options). TTL: above the slowest guarded call, retries included.
	leases, err := lease.New(s.Database("example").Collection("users"), &lease.Options{TTL: 30 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(leases.TTL())
}

func ExampleManager_Do() {
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
	users := s.Database("example").Collection("users")
	if _, err := users.InsertOne(ctx, bson.D{{Key: "_id", Value: "u42"}}); err != nil && !store.IsDuplicateKey(err) {
		fmt.Println(err)
		return
	}
	leases, err := lease.New(users, &lease.Options{TTL: 30 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}

	// Do waits for the lease, renews it while fn runs, ends fn's ctx if it
	// is lost, and releases it when fn returns.
	err = leases.Do(ctx, "u42", func(ctx context.Context, l *lease.Lease) error {
		// ... the slow partner call, with ctx, and l.Epoch() as its key ...
		res, err := users.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: "u42"}}, l.Fence()...),
			bson.D{{Key: "$set", Value: bson.D{{Key: "primary", Value: "google"}}}})
		if err == nil && res.MatchedCount == 0 {
			return lease.ErrLost // fenced: the lease was taken over
		}
		return err
	})
	fmt.Println(err)
}

func ExampleManager_TryAcquire() {
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
	leases, err := lease.New(s.Database("example").Collection("users"), nil) // TTL 30 s
	if err != nil {
		fmt.Println(err)
		return
	}

	l, err := leases.TryAcquire(ctx, "u42")
	var held *lease.HeldError
	switch {
	case errors.As(err, &held):
		fmt.Printf("409 Conflict, Retry-After: %.0f\n", held.TimeLeft.Seconds())
		return
	case errors.Is(err, lease.ErrNotFound):
		fmt.Println("no user u42")
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	defer func() { _ = l.Release(ctx) }()
	fmt.Println("holding the lease until", l.Deadline())
}

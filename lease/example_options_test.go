package lease_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/lease"
)

// New checks its options before anything is sent: a field out of range is
// an *OptionsError, matching ErrInvalid, that names the field. In a
// non-nil Options the TTL has no default: every caller must choose it.
func ExampleNew_invalidOptions() {
	client, err := mongo.Connect() // connects lazily: New sends nothing
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	users := client.Database("shop").Collection("users")

	_, err = lease.New(users, &lease.Options{Owner: "worker-1"}) // no TTL
	var bad *lease.OptionsError
	if errors.As(err, &bad) {
		fmt.Println(bad.Field, errors.Is(err, lease.ErrInvalid))
	}
	_, err = lease.New(users, &lease.Options{TTL: 30 * time.Second, RenewEvery: time.Minute})
	if errors.As(err, &bad) {
		fmt.Println(bad.Field, errors.Is(err, lease.ErrInvalid))
	}
	// Output:
	// TTL true
	// RenewEvery true
}

package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/idempotency"
)

// New does no I/O: a bad Options field fails at once with an error matching
// ErrInvalid, before anything is sent.
func ExampleNew_invalidOptions() {
	client, err := mongo.Connect() // connects lazily: New sends nothing
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	keys := client.Database("shop").Collection("idempotency_keys")

	_, err = idempotency.New(keys, &idempotency.Options{Retention: -time.Hour})
	fmt.Println(errors.Is(err, idempotency.ErrInvalid))
	fmt.Println(err)
	// Output:
	// true
	// idempotency: options: Retention is negative
}

package deferred_test

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/deferred"
)

// New does no I/O: a bad Options field is an *InvalidError, matching
// ErrInvalid, before anything is sent, and the indexes wait for
// EnsureIndexes (which Run and the first Enqueue call).
func ExampleNew_invalidOptions() {
	client, err := mongo.Connect() // connects lazily: New sends nothing
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	jobs := client.Database("shop").Collection("jobs")

	_, err = deferred.New(jobs, &deferred.Options{Workers: -1})
	var invalid *deferred.InvalidError
	fmt.Println(errors.As(err, &invalid), errors.Is(err, deferred.ErrInvalid))
	fmt.Println(err)
	// Output:
	// true true
	// deferred: new: invalid Workers, MaxAttempts, Batch or MaxStamps: negative
}

package move_test

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/move"
)

// A field name a server could read as an operator is refused before
// anything is sent.
func ExampleNew_invalidOptions() {
	client, err := mongo.Connect() // connects lazily: New sends nothing here
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	db := client.Database("bank")
	jobs, err := deferred.New(db.Collection("jobs"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	_, err = move.New(context.Background(), jobs, db.Collection("accounts"), &move.Options{Field: "$balance"})
	var invalid *move.InvalidError
	fmt.Println(errors.As(err, &invalid), errors.Is(err, move.ErrInvalid))
	fmt.Println(err)
	// Output:
	// true true
	// move: new: invalid Field: "$balance" starts with '$' or holds '.' or NUL
}

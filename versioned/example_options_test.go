package versioned_test

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/versioned"
)

// New checks the type once, before anything is sent: a type without an
// int64 version field is an *InvalidError (matching ErrInvalid) that says
// what to fix. New does no I/O, so a service can build its repositories at
// start-up, before the server answers.
func ExampleNew_invalidType() {
	client, err := mongo.Connect() // connects lazily: New sends nothing
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	notes := client.Database("shop").Collection("notes")

	type Note struct {
		ID   string `bson:"_id"`
		Text string `bson:"text"`
	}
	_, err = versioned.New[Note](notes, nil)
	var invalid *versioned.InvalidError
	fmt.Println(errors.As(err, &invalid), errors.Is(err, versioned.ErrInvalid))
	fmt.Println(err)
	// Output:
	// true true
	// versioned: new: invalid input: type versioned_test.Note has no int64 field mapped to "version" (tag one with bson:"version", or set Options.VersionField)
}

package store_test

import (
	"errors"
	"fmt"

	"github.com/mongocas/mongocas/store"
)

// RedactURI is how the packages name a server in errors and logs: the
// password replaced, the rest kept so that the server can be told apart.
func ExampleRedactURI() {
	fmt.Println(store.RedactURI("mongodb://app:s3cret@db1.example.com:27017,db2.example.com/shop?replicaSet=rs0"))
	// Output: mongodb://app:xxxxx@db1.example.com:27017,db2.example.com/shop?replicaSet=rs0
}

// CheckID refuses, before anything is sent, an id that cannot be a
// document's _id; the error matches ErrInvalid, as bad input does in every
// package.
func ExampleCheckID() {
	_, err := store.CheckID(nil)
	fmt.Println(errors.Is(err, store.ErrInvalid))
	fmt.Println(err)
	_, err = store.CheckID("mug")
	fmt.Println(err)
	// Output:
	// true
	// invalid id <nil>: id is nil
	// <nil>
}

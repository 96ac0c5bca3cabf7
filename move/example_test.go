package move_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// The example needs a server: it connects to MONGODB_URI and returns when
// it is not set.
func ExampleMover_Move() {
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
	db := s.Database("example")
	jobs, err := deferred.New(db.Collection("jobs"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	// Once at start-up, in every process: the Mover registers its relay.
	mover, err := move.New(ctx, jobs, db.Collection("accounts"), &move.Options{Field: "balance"})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = jobs.Run(runCtx) }() // relays the credits

	id, err := mover.Move(ctx, "ana", "ben", 30, nil)
	switch {
	case errors.Is(err, versioned.ErrGuardFailed):
		fmt.Println("ana has less than 30: nothing moved")
	case err != nil:
		fmt.Println(err)
	default:
		st, _ := mover.Status(ctx, "ana", id) // pending, then done or returned
		fmt.Println(st)
	}
}

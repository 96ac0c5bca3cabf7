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

// An order of 2 mugs and 1 kettle, all or nothing. The example needs a
// server: it connects to MONGODB_URI and returns when it is not set.
func ExampleMover_MoveAll() {
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
	mover, err := move.New(ctx, jobs, db.Collection("stock"), &move.Options{Field: "units"})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = jobs.Run(runCtx) }() // relays the credits and returns

	saga, err := mover.MoveAll(ctx, []move.Step{
		{From: "mug", To: "order-17", Amount: 2},
		{From: "kettle", To: "order-17", Amount: 1},
	})
	var step *move.StepError
	switch {
	case errors.As(err, &step) && errors.Is(err, versioned.ErrGuardFailed):
		fmt.Println("step", step.Step, "is short or refused: nothing moved")
	case err != nil:
		fmt.Println(err) // aborted otherwise, or the decision's outcome is unknown
	default:
		st, _ := mover.SagaStatus(ctx, saga.ID)
		fmt.Println(st) // done: the relay credits order-17
	}
}

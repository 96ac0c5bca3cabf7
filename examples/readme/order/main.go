// Command order reserves 2 mugs and 1 kettle for one order, all or
// nothing, with MoveAll, and reads what each move became.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// Item is a stock count that orders take from; an order holds what it took.
type Item struct {
	ID      string `bson:"_id"`
	Stock   int64  `bson:"stock"`
	Version int64  `bson:"version"`
}

func main() {
	ctx := context.Background()
	srv, err := mongotest.Start(ctx) // MONGODB_URI, else a server for trying this
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("server:", srv)
	err = run(ctx, srv.URI, "shop", "order-17")
	mongotest.Shutdown()
	if err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, uri, database, order string) error {
	s, err := store.Connect(ctx, uri, nil)
	if err != nil {
		return err
	}
	defer s.Close(ctx)
	db := s.Database(database)
	items, err := versioned.New[Item](db.Collection("items"), nil)
	if err != nil {
		return err
	}
	for _, it := range []*Item{{ID: "mug", Stock: 5}, {ID: "kettle", Stock: 2}, {ID: order}} {
		if err := items.Insert(ctx, it); err != nil && !errors.Is(err, versioned.ErrDuplicate) {
			return err
		}
	}
	q, err := deferred.New(db.Collection("jobs"), nil)
	if err != nil {
		return err
	}
	mover, err := move.New(ctx, q, db.Collection("items"), &move.Options{Field: "stock"})
	if err != nil {
		return err
	}
	relay, stop := context.WithCancel(ctx) // the relay credits the order
	var wg sync.WaitGroup
	wg.Go(func() { _ = q.Run(relay) })
	defer func() { stop(); wg.Wait() }()

	steps := []move.Step{
		{From: "mug", To: order, Amount: 2},
		{From: "kettle", To: order, Amount: 1},
	}
	saga, err := mover.MoveAll(ctx, steps)
	var step *move.StepError
	switch {
	case errors.As(err, &step) && errors.Is(err, versioned.ErrGuardFailed):
		fmt.Println("step", step.Step, "is short or refused: nothing moved") // step.End: "from" or "to"
		return nil
	case errors.Is(err, move.ErrAborted): // a step failed otherwise: nothing moved
		return err
	case err != nil: // the decision's own outcome is unknown: mover.SagaStatus(ctx, saga.ID) tells
		return err
	}
	// Decided done: every item is taken; the relay credits the order.
	for i, id := range saga.Moves {
		for {
			st, err := mover.Status(ctx, steps[i].From, id)
			if err != nil {
				return err
			}
			if st != move.Pending {
				fmt.Println(steps[i].From, "move", st) // done
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	total, err := mover.Sum(ctx, "mug", "kettle", order)
	if err != nil {
		return err
	}
	fmt.Println("mug + kettle + order =", total.Values, "of which pending", total.Pending)
	return nil
}

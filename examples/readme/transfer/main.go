// Command transfer moves 30 from one account to another exactly once,
// without a transaction, and reads the total that stays constant.
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

// Account is a balance that moves take from and give to.
type Account struct {
	ID      string `bson:"_id"`
	Balance int64  `bson:"balance"`
	Version int64  `bson:"version"`
}

func main() {
	ctx := context.Background()
	// The server at MONGODB_URI; with none, one started for trying this (Docker,
	// else embedded). mongotest is for tests and trials: a service dials its own.
	srv, err := mongotest.Start(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("server:", srv)
	err = run(ctx, srv.URI, "bank")
	mongotest.Shutdown() // stops a server it started and removes its data
	if err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, uri, database string) error {
	s, err := store.Connect(ctx, uri, nil)
	if err != nil {
		return err
	}
	defer s.Close(ctx)
	db := s.Database(database)
	accounts, err := versioned.New[Account](db.Collection("accounts"), nil)
	if err != nil {
		return err
	}
	for _, a := range []*Account{{ID: "ana", Balance: 100}, {ID: "ben"}} {
		if err := accounts.Insert(ctx, a); err != nil && !errors.Is(err, versioned.ErrDuplicate) {
			return err
		}
	}

	q, err := deferred.New(db.Collection("jobs"), nil)
	if err != nil {
		return err
	}
	mover, err := move.New(ctx, q, db.Collection("accounts"), &move.Options{Field: "balance"})
	if err != nil {
		return err
	}
	// The relay, in every process that moves; call mover.Sweep periodically in one.
	relay, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = q.Run(relay) })
	defer func() { stop(); wg.Wait() }()

	id, err := mover.Move(ctx, "ana", "ben", 30, nil) // one round trip: the debit
	if errors.Is(err, versioned.ErrGuardFailed) {
		fmt.Println("ana has less than 30: nothing moved")
		return nil
	}
	if err != nil {
		return err
	}
	total, err := mover.Sum(ctx, "ana", "ben") // balances + pending: constant at every instant
	if err != nil {
		return err
	}
	fmt.Println("just after the debit: ana + ben + pending =", total.Sum)
	for {
		st, err := mover.Status(ctx, "ana", id)
		if err != nil {
			return err
		}
		if st != move.Pending {
			fmt.Println("move", st) // done, or returned if ben could not take it
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	total, err = mover.Sum(ctx, "ana", "ben")
	if err != nil {
		return err
	}
	fmt.Println("settled: ana + ben =", total.Values, "of which pending", total.Pending)
	return nil
}

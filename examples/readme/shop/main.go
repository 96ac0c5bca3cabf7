// Command shop takes stock with Guarded and restocks with Modify, or later.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// Item is a product in stock; the repository owns its version field.
type Item struct {
	SKU     string `bson:"_id"`
	Stock   int64  `bson:"stock"`
	Version int64  `bson:"version"`
}

var ErrSoldOut = errors.New("sold out")

// Take removes qty if at least qty are left: one statement, nothing to retry.
func Take(ctx context.Context, items *versioned.Repo[Item], sku string, qty int64) error {
	_, err := items.Guarded(ctx, sku,
		bson.D{{Key: "stock", Value: bson.D{{Key: "$gte", Value: qty}}}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -qty}}}})
	if errors.Is(err, versioned.ErrGuardFailed) {
		return ErrSoldOut
	}
	return err // nil, versioned.ErrNotFound, a driver error...
}

// restock only computes: Modify may call it again after a version conflict.
func restock(it *Item, n int64) error {
	it.Stock = max(it.Stock, n)
	return nil
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
	err = run(ctx, srv.URI, "shop")
	mongotest.Shutdown() // stops a server it started and removes its data
	if err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, uri, database string) error {
	s, err := store.Connect(ctx, uri, nil)
	if err != nil {
		return err // a *store.ConnectError, the password redacted
	}
	defer s.Close(ctx)
	items, err := versioned.New[Item](s.Database(database).Collection("items"), nil)
	if err != nil {
		return err
	}
	if err := items.Insert(ctx, &Item{SKU: "mug"}); err != nil && !errors.Is(err, versioned.ErrDuplicate) {
		return err
	}
	if _, err := items.Modify(ctx, "mug", func(it *Item) error { return restock(it, 5) }); err != nil {
		return err
	}
	fmt.Println(Take(ctx, items, "mug", 3), Take(ctx, items, "mug", 3)) // first run: <nil> sold out

	// Modify now or, if its retries run out, queue it to apply later, once.
	jobs, err := deferred.New(s.Database(database).Collection("jobs"), nil)
	if err != nil {
		return err
	}
	later, err := deferred.NewChange(jobs, "item.restock", items, restock) // in every instance
	if err != nil {
		return err
	}
	workers, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = jobs.Run(workers) }() // where the queue should be worked
	res, err := later.ModifyOrEnqueue(ctx, "mug", 10)
	switch {
	case err != nil:
		return err // fn's error, not found, an unknown outcome: nothing queued
	case res.Queued:
		fmt.Println("202 Accepted, poll /jobs/" + res.JobID.Hex()) // jobs.Job(ctx, id)
	default:
		fmt.Println("200 OK, stock", res.Doc.Stock)
	}
	return nil
}

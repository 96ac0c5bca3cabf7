// Command observed logs what mongocas does and counts it for a metrics
// page: nothing at Info while all goes well; a lost lease or an unknown
// outcome is a warning.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

type Wallet struct {
	ID      string `bson:"_id"`
	Balance int64  `bson:"balance"`
	Version int64  `bson:"version"`
}

// NewWallets returns the wallets repository with an Observer that logs and
// counts. The OpenTelemetry adapter, otelmongocas.New, joins the same way.
func NewWallets(coll *mongo.Collection, logger *slog.Logger, counts *observe.Counters) (*versioned.Repo[Wallet], error) {
	return versioned.New[Wallet](coll, &versioned.Options{
		Observer: observe.Join(observe.Slog(logger), counts),
	})
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
		return err
	}
	defer s.Close(ctx)
	var counts observe.Counters // one for the whole service
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	wallets, err := NewWallets(s.Database(database).Collection("wallets"), logger, &counts)
	if err != nil {
		return err
	}
	if err := wallets.Insert(ctx, &Wallet{ID: "ana", Balance: 100}); err != nil && !errors.Is(err, versioned.ErrDuplicate) {
		return err
	}
	if _, err := wallets.Modify(ctx, "ana", func(w *Wallet) error { w.Balance--; return nil }); err != nil {
		return err
	}
	fmt.Println(counts.String()) // operations, conflicts, retries, lost replies...
	return nil
}

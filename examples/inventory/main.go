// Command inventory sells the last items of a product to many concurrent
// buyers, first with a naive read-check-write (which oversells) and then with
// one versioned.Guarded call per order, "take one if stock >= 1" (which never
// does), and prints buyers, items, orders, final stock and oversold count.
//
//	go run ./examples/inventory -buyers 200 -items 10
//
// This file is the checkout a service would write; the naive checkout, the
// buyers, the checks and the table are in examples/internal.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/examples/internal/cli"
	"github.com/mongocas/mongocas/examples/internal/scenario"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/versioned"
)

// Product is a product in stock. The repository owns Version: reads fill it
// in, writes raise it.
type Product struct {
	SKU     string `bson:"_id"`
	Name    string `bson:"name"`
	Stock   int64  `bson:"stock"`
	Version int64  `bson:"version"`
}

// errSoldOut is the buyer's "sorry, sold out" (a 409 from an HTTP handler).
var errSoldOut = errors.New("sold out")

// shop is the checkout.
type shop struct {
	products *versioned.Repo[Product]
}

// newShop returns the checkout on the products collection. A service gets
// the collection from a client made once at start-up, with production
// defaults:
//
//	st, err := store.Connect(ctx, os.Getenv("MONGODB_URI"), nil)
//	...
//	defer st.Close(ctx)
//	s, err := newShop(st.Database("shop").Collection("products"), observe.Slog(logger))
//
// obs sees each call, version conflict, retry and lost reply (nil: none).
func newShop(products *mongo.Collection, obs observe.Observer) (*shop, error) {
	repo, err := versioned.New[Product](products, &versioned.Options{Observer: obs}) // the other options: their defaults
	if err != nil {
		return nil, err // a Product that versioned cannot use: no _id, no int64 version
	}
	return &shop{products: repo}, nil
}

// AddProduct stores a new product. Insert gives it its first version.
func (s *shop) AddProduct(ctx context.Context, sku, name string, stock int64) error {
	err := s.products.Insert(ctx, &Product{SKU: sku, Name: name, Stock: stock})
	if errors.Is(err, versioned.ErrDuplicate) {
		return fmt.Errorf("product %s exists already: %w", sku, err)
	}
	return err
}

// Buy takes one item of sku: one atomic statement, "take one if at least
// one is left", so there is no read first, no conflict and no retry, and
// two buyers can never take the same last item.
func (s *shop) Buy(ctx context.Context, sku string) error {
	_, err := s.products.Guarded(ctx, sku,
		bson.D{{Key: "stock", Value: bson.D{{Key: "$gte", Value: 1}}}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -1}}}})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, versioned.ErrGuardFailed):
		return errSoldOut // nothing was taken
	case errors.Is(err, versioned.ErrUnknownOutcome):
		// The reply was lost and re-reading could not tell whether the item
		// was taken. Retrying could take two: report the order as pending
		// and let reconciliation (the write id in the error) settle it.
		if unknown, ok := errors.AsType[*versioned.UnknownOutcomeError](err); ok {
			return fmt.Errorf("order for %s pending (write %s): %w", sku, unknown.WriteID, err)
		}
		return err
	case errors.Is(err, versioned.ErrNotFound):
		return fmt.Errorf("no product %s: %w", sku, err) // a 404
	default:
		return fmt.Errorf("order for %s: %w", sku, err) // the driver's error: the server is unreachable, ctx ended...
	}
}

// events counts what the checkout's repository reports; the program prints
// the counts under its table.
var events observe.Counters

// checkout is this file's checkout as the scenario runs it, beside the
// naive one. The table names it after the call Buy makes.
var checkout = scenario.InventoryStrategy{
	Name:    "versioned.Guarded",
	Kind:    scenario.KindMongocas,
	Open:    func(coll *mongo.Collection) (scenario.Shop, error) { return newShop(coll, &events) },
	SoldOut: errSoldOut,
}

func main() {
	os.Exit(cli.Main("inventory", "The last items and many buyers: naive read-check-write vs versioned.Guarded.", os.Args[1:], os.Stdout, os.Stderr,
		&scenario.Inventory{Mongocas: checkout}, &events))
}

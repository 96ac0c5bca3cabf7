package scenario

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/versioned"
)

// Inventory (seed 003): the last items of a product and many buyers at once.
//
// The naive checkout reads the stock, checks it and then takes the item with
// $inc: every buyer that read the stock before the others' writes landed
// believes an item is left, so the shop sells more than it has and the stock
// goes negative. The mongocas checkout is one versioned.Guarded call, "take
// one if stock >= 1": the server checks and takes in one atomic statement,
// so it never oversells and needs no retry.

// InventoryStrategy names a way to take an item from stock.
type InventoryStrategy string

// The inventory strategies.
const (
	// InventoryNaive reads the stock, checks it, then $incs it down.
	InventoryNaive InventoryStrategy = "naive read, check, $inc"
	// InventoryGuarded is one versioned.Guarded: {stock >= 1} and $inc -1.
	InventoryGuarded InventoryStrategy = "versioned.Guarded"
)

// InventoryConfig sizes an inventory run. Zero fields take their defaults.
type InventoryConfig struct {
	// Buyers is how many buyers try to buy one item each. Default 50.
	Buyers int
	// Items is the stock at the start. Default 10.
	Items int
	// Concurrency is how many buyers shop at once. Default all of them.
	Concurrency int
	// Progress, if not nil, receives a line now and then during a long run.
	Progress io.Writer
}

func (c InventoryConfig) withDefaults() InventoryConfig {
	if c.Buyers <= 0 {
		c.Buyers = 50
	}
	if c.Items <= 0 {
		c.Items = 10
	}
	if c.Concurrency <= 0 {
		c.Concurrency = c.Buyers
	}
	return c
}

// InventoryResult is what an inventory run did.
type InventoryResult struct {
	Row
	// Buyers and Items are the run's size.
	Buyers, Items int
	// Orders is how many buyers were told their order was taken.
	Orders int
	// SoldOut is how many were told the product is sold out.
	SoldOut int
	// FinalStock is the stock stored at the end.
	FinalStock int64
	// Oversold is how many orders were taken beyond the stock.
	Oversold int
}

// Product is the stock document. The version field is versioned's; the naive
// strategy ignores it.
type Product struct {
	ID      string `bson:"_id"`
	Name    string `bson:"name"`
	Stock   int64  `bson:"stock"`
	Version int64  `bson:"version"`
}

// errSoldOut is a buyer's "sorry, sold out".
var errSoldOut = errors.New("sold out")

// RunInventory runs one inventory strategy on a fresh collection of db.
func RunInventory(ctx context.Context, db *mongo.Database, s InventoryStrategy, cfg InventoryConfig) (*InventoryResult, error) {
	cfg = cfg.withDefaults()
	coll := db.Collection("inventory_" + slug(string(s)))
	if err := coll.Drop(ctx); err != nil {
		return nil, fmt.Errorf("inventory: drop: %w", err)
	}
	const sku = "sku-last-items"
	var buy func(ctx context.Context) error
	switch s {
	case InventoryNaive:
		if _, err := coll.InsertOne(ctx, Product{ID: sku, Name: "the last items", Stock: int64(cfg.Items)}); err != nil {
			return nil, fmt.Errorf("inventory: insert product: %w", err)
		}
		buy = func(ctx context.Context) error { return buyNaive(ctx, coll, sku) }
	case InventoryGuarded:
		repo, err := versioned.New[Product](coll, nil)
		if err != nil {
			return nil, err
		}
		if err := repo.Insert(ctx, &Product{ID: sku, Name: "the last items", Stock: int64(cfg.Items)}); err != nil {
			return nil, fmt.Errorf("inventory: insert product: %w", err)
		}
		buy = func(ctx context.Context) error {
			_, err := repo.Guarded(ctx, sku,
				bson.D{{Key: "stock", Value: bson.D{{Key: "$gte", Value: 1}}}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -1}}}})
			if errors.Is(err, versioned.ErrGuardFailed) {
				return errSoldOut
			}
			return err
		}
	default:
		return nil, fmt.Errorf("inventory: unknown strategy %q", s)
	}

	warmUp(ctx, db, cfg.Concurrency)
	res := &InventoryResult{Row: Row{Scenario: "inventory", Strategy: string(s), Kind: kindOf(s != InventoryNaive), Requests: cfg.Buyers}, Buyers: cfg.Buyers, Items: cfg.Items}
	outcomes := make([]error, cfg.Buyers)
	var rec recorder
	start := time.Now()
	p := startProgress(cfg.Progress, "inventory/"+string(s), cfg.Buyers)
	forEach(cfg.Buyers, cfg.Concurrency, p, func(i int) {
		rec.time(func() { outcomes[i] = buy(ctx) })
	})
	p.end()
	res.Elapsed, res.Latency = time.Since(start), rec.latency()
	var firstErr error
	for _, err := range outcomes {
		switch {
		case err == nil:
			res.Orders++
		case errors.Is(err, errSoldOut):
			res.SoldOut++
		default:
			res.Errors++
			firstErr = cmp.Or(firstErr, err)
		}
	}

	var final Product
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: sku}}).Decode(&final); err != nil {
		return nil, fmt.Errorf("inventory: read final stock: %w", err)
	}
	res.FinalStock = final.Stock
	res.Oversold = max(res.Orders-cfg.Items, 0)
	// Every order took exactly one item, so the stock must be the items
	// left; a difference is an item sold twice or lost.
	drift := abs(int64(cfg.Items-res.Orders) - res.FinalStock)
	res.Anomalies = res.Oversold + int(drift)
	res.Details = append(res.Details, fmt.Sprintf("%d buyers, %d items: %d orders taken, %d told sold out, final stock %d, oversold %d",
		cfg.Buyers, cfg.Items, res.Orders, res.SoldOut, res.FinalStock, res.Oversold))
	if drift != 0 {
		res.Details = append(res.Details, fmt.Sprintf("stock is off by %d from the items minus the orders", drift))
	}
	if firstErr != nil {
		res.Details = append(res.Details, fmt.Sprintf("%d requests failed, first: %v", res.Errors, firstErr))
	}
	return res, nil
}

// buyNaive is the checkout of seed 003 before its fixes: read, check, write.
func buyNaive(ctx context.Context, coll *mongo.Collection, sku string) error {
	var p Product
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: sku}}).Decode(&p); err != nil {
		return err
	}
	if p.Stock < 1 {
		return errSoldOut
	}
	_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: sku}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -1}}}})
	return err
}

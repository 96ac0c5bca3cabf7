package scenario

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Inventory (seed 003): the last items of a product and many buyers at once.
//
// The naive checkout reads the stock, checks it and then takes the item with
// $inc: every buyer that read the stock before the others' writes landed
// believes an item is left, so the shop sells more than it has and the stock
// goes negative. The mongocas checkout, in examples/inventory/main.go, is one
// versioned.Guarded call, "take one if stock >= 1": the server checks and
// takes in one atomic statement, so it never oversells and needs no retry.

// Shop is a checkout: the code under test in the inventory scenario.
type Shop interface {
	// AddProduct stores a product with stock items.
	AddProduct(ctx context.Context, sku, name string, stock int64) error
	// Buy takes one item of sku. It returns nil when the order is taken,
	// an error matching the strategy's SoldOut when no item is left, and
	// any other error when the order failed.
	Buy(ctx context.Context, sku string) error
}

// InventoryStrategy is a way to take an item from stock.
type InventoryStrategy struct {
	// Name names it in the table.
	Name string
	// Kind is KindNaive or KindMongocas.
	Kind string
	// Open returns the shop on an empty collection.
	Open func(coll *mongo.Collection) (Shop, error)
	// SoldOut is the error Buy returns when no item is left.
	SoldOut error
}

// String returns the strategy's name.
func (s InventoryStrategy) String() string { return s.Name }

// InventoryNaive reads the stock, checks it, then $incs it down.
var InventoryNaive = InventoryStrategy{
	Name:    "naive read, check, $inc",
	Kind:    KindNaive,
	Open:    func(coll *mongo.Collection) (Shop, error) { return naiveShop{coll}, nil },
	SoldOut: errSoldOut,
}

// Inventory is the inventory scenario: InventoryNaive, then the program's
// own checkout.
type Inventory struct {
	// Config sizes the run; RegisterFlags binds it to flags.
	Config InventoryConfig
	// Mongocas is the program's checkout.
	Mongocas InventoryStrategy
}

// Name returns "inventory".
func (*Inventory) Name() string { return "inventory" }

// RegisterFlags registers the scenario's sizes on fs.
func (sc *Inventory) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&sc.Config.Buyers, "buyers", 50, "inventory: concurrent buyers, one item each")
	fs.IntVar(&sc.Config.Items, "items", 10, "inventory: items in stock at the start")
	fs.IntVar(&sc.Config.Concurrency, "buyer-concurrency", 0, "inventory: buyers shopping at once (0: all)")
}

// Run runs InventoryNaive and then sc.Mongocas.
func (sc *Inventory) Run(ctx context.Context, env Env, rep *Report) error {
	cfg := sc.Config
	cfg.Progress = env.Progress
	return runEach(rep, sc.Name(), "", []InventoryStrategy{InventoryNaive, sc.Mongocas},
		func(s InventoryStrategy) (*InventoryResult, error) { return RunInventory(ctx, env.DB, s, cfg) })
}

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

// errSoldOut is the naive buyer's "sorry, sold out".
var errSoldOut = errors.New("sold out")

// RunInventory runs one inventory strategy on a fresh collection of db.
func RunInventory(ctx context.Context, db *mongo.Database, s InventoryStrategy, cfg InventoryConfig) (*InventoryResult, error) {
	cfg = cfg.withDefaults()
	if s.Open == nil || s.SoldOut == nil {
		return nil, fmt.Errorf("inventory: strategy %q has no Open or no SoldOut", s.Name)
	}
	coll := db.Collection("inventory_" + slug(s.Name))
	if err := coll.Drop(ctx); err != nil {
		return nil, fmt.Errorf("inventory: drop: %w", err)
	}
	shop, err := s.Open(coll)
	if err != nil {
		return nil, err
	}
	const sku = "sku-last-items"
	if err := shop.AddProduct(ctx, sku, "the last items", int64(cfg.Items)); err != nil {
		return nil, fmt.Errorf("inventory: add product: %w", err)
	}

	warmUp(ctx, db, cfg.Concurrency)
	res := &InventoryResult{Row: Row{Scenario: "inventory", Strategy: s.Name, Kind: s.Kind, Requests: cfg.Buyers}, Buyers: cfg.Buyers, Items: cfg.Items}
	outcomes := make([]error, cfg.Buyers)
	var rec recorder
	start := time.Now()
	p := startProgress(cfg.Progress, "inventory/"+s.Name, cfg.Buyers)
	forEach(cfg.Buyers, cfg.Concurrency, p, func(i int) {
		rec.time(func() { outcomes[i] = shop.Buy(ctx, sku) })
	})
	p.end()
	res.Elapsed, res.Latency = time.Since(start), rec.latency()
	var firstErr error
	for _, err := range outcomes {
		switch {
		case err == nil:
			res.Orders++
		case errors.Is(err, s.SoldOut):
			res.SoldOut++
		default:
			res.Errors++
			firstErr = cmp.Or(firstErr, err)
		}
	}

	var final struct {
		Stock int64 `bson:"stock"`
	}
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

// naiveShop is the checkout of seed 003 before its fixes: read, check,
// write.
type naiveShop struct{ coll *mongo.Collection }

func (n naiveShop) AddProduct(ctx context.Context, sku, name string, stock int64) error {
	_, err := n.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: sku}, {Key: "name", Value: name}, {Key: "stock", Value: stock}})
	return err
}

func (n naiveShop) Buy(ctx context.Context, sku string) error {
	var p struct {
		Stock int64 `bson:"stock"`
	}
	if err := n.coll.FindOne(ctx, bson.D{{Key: "_id", Value: sku}}).Decode(&p); err != nil {
		return err
	}
	if p.Stock < 1 {
		return errSoldOut
	}
	_, err := n.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: sku}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -1}}}})
	return err
}

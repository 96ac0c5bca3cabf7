// Command inventory sells the last items of a product to many concurrent
// buyers, first with a naive read-check-write (which oversells) and then with
// one versioned.Guarded call per order, "take one if stock >= 1" (which never
// does), and prints buyers, items, orders, final stock and oversold count.
//
//	go run ./examples/inventory -buyers 200 -items 10
package main

import (
	"os"

	"github.com/mongocas/mongocas/examples/internal/cli"
	"github.com/mongocas/mongocas/examples/internal/scenario"
)

func main() {
	os.Exit(cli.Main("inventory", "The last items and many buyers: naive read-check-write vs versioned.Guarded.", os.Args[1:], os.Stdout, os.Stderr,
		scenario.ScenarioInventory))
}

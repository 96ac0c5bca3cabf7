// Command wallet makes many concurrent debits and credits on a few wallets,
// first with a naive read-compute-$set (which loses updates, creating or
// destroying money) and then with versioned.Modify (read-modify-write under
// a version check, conflicts retried), and prints operations, conflicts
// retried, and expected and actual totals. Where the server has
// transactions it also moves money between wallets in transactions; where it
// has not, it says so and skips them.
//
//	go run ./examples/wallet -wallets 2 -ops 1000
package main

import (
	"os"

	"github.com/mongocas/mongocas/examples/internal/cli"
	"github.com/mongocas/mongocas/examples/internal/scenario"
)

func main() {
	os.Exit(cli.Main("wallet", "Concurrent debits and credits: naive $set of the computed balance vs versioned.Modify.", os.Args[1:], os.Stdout, os.Stderr,
		scenario.ScenarioWallet))
}

// Command demo runs the three jobs mongocas is for, each the naive way and
// the mongocas way side by side, and prints what went wrong in each:
//
//   - inventory: the last items and many buyers (naive read-check-write
//     oversells; versioned.Guarded never does);
//   - wallet: concurrent debits and credits on a few balances (a naive $set of
//     the computed balance creates or destroys money; versioned.Modify keeps
//     every balance exact; with four instances of the service, the changes
//     whose retries run out are queued and applied later, exactly once), and
//     transfers in a transaction where the server has them;
//   - identity: switching a user's primary identity at a partner identity
//     provider, two HTTP calls that must not interleave (no lock corrupts;
//     the lease serializes them, answers a double click with ErrHeld and
//     fences the partner calls with its epoch).
//
// The mongocas code is in the example programs' main.go files: the demo
// builds those programs and runs each on one server, with its flags, and
// prints their results as one table. It exits non-zero if a mongocas
// strategy shows an anomaly. With no -uri and no MONGODB_URI it runs on the
// embedded default server.
//
//	go run ./examples/demo
//	go run ./examples/demo -uri 'mongodb://localhost:27017/?replicaSet=rs0'
package main

import (
	"os"

	"github.com/mongocas/mongocas/examples/internal/cli"
	"github.com/mongocas/mongocas/examples/internal/scenario"
)

func main() {
	os.Exit(cli.Demo("The three jobs, the naive way and the mongocas way side by side.", os.Args[1:], os.Stdout, os.Stderr,
		&scenario.Inventory{}, &scenario.Wallet{}, &scenario.Identity{}))
}

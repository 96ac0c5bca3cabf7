// Command identity switches users' primary identities at a fake partner
// identity provider (an httptest server with latency and occasional 503s that
// the caller retries), several switches per user at once: with no lock (the
// unlink and link calls interleave and corrupt the primary), under a lease
// (they never do; a double click gets ErrHeld with the time left; the lease
// epoch is the partner's fencing token and idempotency key) and, where the
// server has transactions, with a transaction held across the HTTP calls
// (the anti-pattern: it serializes, at the cost of locks held and waits).
//
//	go run ./examples/identity -users 20 -switches 4 -failure-rate 0.2
package main

import (
	"os"

	"github.com/mongocas/mongocas/examples/internal/cli"
	"github.com/mongocas/mongocas/examples/internal/scenario"
)

func main() {
	os.Exit(cli.Main("identity", "Primary identity switch at a partner API: no lock vs lease (vs a transaction held across HTTP).", os.Args[1:], os.Stdout, os.Stderr,
		scenario.ScenarioIdentity))
}

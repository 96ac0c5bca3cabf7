// Package scenario is the harness of the example programs: it runs the three
// jobs mongocas is for, each the naive way beside the program's own mongocas
// code, under concurrency, checks the result and prints a table.
//
// The mongocas code is not here: it is in each program's main.go, the file
// a reader copies from, and reaches the harness as a value (a Shop, Wallets
// or Identities constructor in an InventoryStrategy, WalletStrategy or
// IdentityStrategy). The naive strategies, the workload, the fake partner
// identity provider, the checks and the table are here.
//
//   - Inventory (seed 003): the last items and many buyers. A naive
//     read-check-write oversells; examples/inventory's versioned.Guarded
//     never does.
//   - Wallet (seed 004): concurrent debits and credits on a few balances.
//     A naive $set of the computed balance creates or destroys money;
//     examples/wallet's versioned.Modify keeps every balance equal to its
//     opening value plus the acknowledged changes. Transfers between
//     wallets run in its transaction where the server has them, and are
//     refused (ErrNoTransactions) where it has not: never faked with two
//     writes.
//   - Identity (seeds 000/002): switching a user's primary identity at a
//     fake partner identity provider, two HTTP calls that must not
//     interleave. No lock corrupts; examples/identity's lease serializes
//     them, answers a double click with ErrHeld and the time left, and sends
//     its epoch to the partner as fencing token and idempotency key. Where
//     the server has transactions, the anti-pattern of a transaction held
//     across the HTTP calls runs too. Clients of examples/identity's HTTP
//     API that time out and retry with their Idempotency-Key get the first
//     answer back, and never switch twice (RetryResult).
//
// Each run returns a result that embeds a Row (requests, anomalies,
// unexpected errors, latency percentiles, detail lines); a Scenario adds its
// rows to a Report, which prints the table. The demo runs the three example
// programs and merges their reports.
//
// # Guarantees
//
// The runs check exact invariants, and the example programs' tests require
// them of their mongocas code: no item oversold and the stock exactly the
// items minus the orders; every balance exactly its opening value plus the
// acknowledged changes; no two switches of one user overlapping at the
// partner, every user ending with exactly the primary the database holds,
// and every double click refused with ErrHeld. The naive strategies usually
// break these, but nothing depends on their doing so.
//
// # Errors
//
// A Run function returns an error only when the run could not be made (the
// database refused the setup, a strategy without its functions) or, as
// ErrNoTransactions, when the strategy needs transactions the server lacks.
// What went wrong inside a run is counted in its result, never returned.
package scenario

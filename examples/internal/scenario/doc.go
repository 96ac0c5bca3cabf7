// Package scenario is the one implementation of the three jobs the examples
// show, each done the naive way and the mongocas way side by side: the demo,
// the example programs and the tests all run it.
//
//   - RunInventory (seed 003): the last items and many buyers. A naive
//     read-check-write oversells; versioned.Guarded never does.
//   - RunWallet (seed 004): concurrent debits and credits on a few balances.
//     A naive $set of the computed balance creates or destroys money;
//     versioned.Modify keeps every balance equal to its opening value plus
//     the acknowledged changes. Transfers between wallets run in a
//     transaction where the server has them, and are refused
//     (ErrNoTransactions) where it has not: never faked with two writes.
//   - RunIdentity (seeds 000/002): switching a user's primary identity at a
//     fake partner identity provider, two HTTP calls that must not
//     interleave. No lock corrupts; the lease serializes them, answers a
//     double click with ErrHeld and the time left, and sends its epoch to the
//     partner as fencing token and idempotency key. Where the server has
//     transactions, the anti-pattern of a transaction held across the HTTP
//     calls runs too.
//
// Each run returns a result that embeds a Row (requests, anomalies,
// unexpected errors, latency percentiles, detail lines); RunDemo runs them
// all and prints the table.
//
// # Guarantees
//
// For the mongocas strategies the runs check, and the tests require, exact
// invariants: no item oversold and the stock exactly the items minus the
// orders; every balance exactly its opening value plus the acknowledged
// changes; no two switches of one user overlapping at the partner, every
// user ending with exactly the primary the database holds, and every double
// click refused with ErrHeld. The naive strategies usually break these, but
// nothing depends on their doing so.
//
// # Errors
//
// A Run function returns an error only when the run could not be made (the
// database refused the setup, an unknown strategy) or, as ErrNoTransactions,
// when the strategy needs transactions the server lacks. What went wrong
// inside a run is counted in its result, never returned.
package scenario

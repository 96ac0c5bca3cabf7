// Package store connects to MongoDB with production defaults and tells the
// rest of mongocas what the server is: what it can do, what time it is there,
// and what an error means.
//
// # Connecting
//
// [Connect] opens a client with the defaults a service should not have to
// remember (majority write concern with journaling, retryable writes and
// reads, primary reads, bounded connect and server-selection timeouts, an app
// name) and pings the primary, so a wrong URI fails at start-up. [New] wraps a
// *mongo.Client the caller already has and leaves its lifecycle to the
// caller.
//
// # Capabilities
//
// [Probe] finds what the server can do by trying each feature and checking its
// effect: topology from hello, the kind of server (MongoDB, FerretDB v1,
// FerretDB v2 on DocumentDB) from buildInfo, then $expr with $$NOW in a write
// filter and $$NOW in an update pipeline, an update pipeline, a transaction
// whose aborted insert must be gone and whose committed one must be there,
// and a TTL index, on scratch documents it deletes afterwards. It never reads
// the version number to decide: FerretDB v1 reports 7.0.42 and lacks most of
// those, and FerretDB v2 accepts startTransaction but applies each write at
// once.
//
// [For] returns the one [Server] of a client: its capabilities, probed once
// and lazily (a failed probe is tried again by the next caller), its kind, and
// one [ServerClock] shared by everything made on the client. The versioned,
// lease, deferred and idempotency packages ask it, never the server directly.
//
// # The server clock
//
// Lease expiry is judged on the database server's clock, not on the
// application host's. Where the server has $expr and $$NOW, judge it inside
// the server and need no estimate; elsewhere a [ServerClock] estimates the server's
// time from the localTime field of hello (sent to the primary) plus the local
// monotonic time elapsed since the reading. The error bound of an [Estimate] is
// (round trip + 1 ms) / 2 + DriftRate × age. A ServerClock keeps its best fresh
// reading: a stale one (older than ResyncInterval) is replaced by the next
// successful reading whatever its round trip, so a slower network widens the
// bound but never leaves the ServerClock on an old reading; one past MaxAge is never
// used. The derivations are in DESIGN.md beside this file.
//
// # Guarantees
//
//   - Connect returns only after the primary answered a ping.
//   - An Estimate brackets the server's true time, Earliest() ≤ true ≤
//     Latest(), as long as the clocks drift apart by less than DriftRate and
//     the reading's round trip was real (not replayed).
//   - [ServerClock.Now] returns an Estimate from a reading younger than MaxAge, or an
//     error matching [ErrNoServerTime]; never the zero Estimate with a nil
//     error. One call sends at most Samples hellos; concurrent callers share
//     one sync; while every reading succeeds, a ServerClock sends at most Samples ×
//     (1 + ⌊T / ResyncInterval⌋) hellos in any span T.
//   - The error classifiers look only at error types, codes and labels,
//     through errors.As and errors.Is, so they keep working on wrapped errors;
//     they never match message text, with one narrow exception: [IsDuplicateKey]
//     also recognises FerretDB v2's InternalError (code 1) carrying
//     PostgreSQL's duplicate-key message, its answer to a duplicate key inside
//     findAndModify.
//
// # Errors
//
//   - [ErrConnect] ([*ConnectError]): Connect could not parse the URI or reach a
//     primary. The error names the URI with its secrets (password, secret
//     options) redacted by [RedactURI], and wraps the driver's error.
//   - [ErrNoServerTime]: a ServerClock has no usable reading of the server's clock
//     (none, or one older than MaxAge) and could not take one (server
//     unreachable, no localTime in hello, context ended: then the error
//     matches the context's error too).
//   - [IsDuplicateKey], [IsNetwork], [IsTimeout], [IsWriteConflict], [HasLabel],
//     [IsTransient], [IsAmbiguous] and [IsDeadlineTooClose] classify the
//     driver's errors. IsAmbiguous
//     is the one that matters for writes: after such an error the write may or
//     may not have been applied, and code that must apply a change exactly
//     once re-reads before retrying.
package store

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
// # The server
//
// [Probe] finds what the server can do by trying each feature and checking
// its effect, never by reading the version number (FerretDB v1 reports
// 7.0.42 and lacks most of them). [For] returns the one [Server] of a
// client: its capabilities, probed once and lazily, its kind, and one
// [ServerClock] shared by everything made on the client.
//
// Where the server lacks $expr and $$NOW, a [ServerClock] estimates its time
// from hello's localTime, within a bound (see [Estimate] and DESIGN.md).
//
// # Guarantees
//
//   - Connect returns only after the primary answered a ping.
//   - An Estimate brackets the server's true time, Earliest() ≤ true ≤
//     Latest(), as long as the clocks drift apart by less than DriftRate and
//     the reading's round trip was real (not replayed).
//   - [ServerClock.Now] returns an Estimate from a reading younger than
//     MaxAge, or an error matching [ErrNoServerTime]; never the zero
//     Estimate with a nil error. One call sends at most Samples hellos;
//     concurrent callers share one sync; while every reading succeeds, a
//     ServerClock sends at most Samples × (1 + ⌊T / ResyncInterval⌋) hellos
//     in any span T.
//   - The error classifiers look only at error types, codes and labels,
//     through errors.As and errors.Is, so they keep working on wrapped
//     errors; they never match message text, with one narrow exception:
//     [IsDuplicateKey] and [IsWriteConflict] also recognise FerretDB v2's
//     pass-through of PostgreSQL's errors (code 1, InternalError).
//
// # Errors
//
//   - [ErrConnect] ([*ConnectError]): Connect could not parse the URI or
//     reach a primary. The error names the URI with its secrets redacted by
//     [RedactURI], and wraps the driver's error.
//   - [ErrNoServerTime]: a ServerClock has no usable reading of the server's
//     clock and could not take one (server unreachable, no localTime in
//     hello, context ended: then the error matches the context's error too).
//   - [ErrInvalid], [ErrInvalidID] ([*IDError]): input refused before
//     anything was sent; [ErrUnknownOutcome] ([*UnknownOutcomeError]): a
//     write whose outcome could not be settled. Every package returns these.
//   - [IsAmbiguous] classifies the driver's errors for writes: after such an
//     error the write may or may not have been applied, and code that must
//     apply a change exactly once re-reads before retrying. [IsTransient],
//     [IsDuplicateKey], [IsWriteConflict], [IsNetwork], [IsTimeout],
//     [HasLabel] and [IsDeadlineTooClose] classify the others.
package store

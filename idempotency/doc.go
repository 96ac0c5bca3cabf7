// Package idempotency makes a retried request safe: the first request with
// an idempotency key runs, and every retry with the same key gets the first
// one's result back instead of running again (a second charge, a second
// identity switch). It follows the IETF HTTP API draft "The Idempotency-Key
// HTTP Header Field" and Stripe's API, with keys kept in MongoDB.
//
//	keys, err := idempotency.New(db.Collection("idempotency_keys"), nil)
//	...
//	res, err := keys.Do(ctx, key, fingerprint, func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
//		id, err := c.Step(ctx, "charge", func(ctx context.Context, partnerKey string) ([]byte, error) {
//			return psp.Charge(ctx, partnerKey, amount) // the partner dedupes on partnerKey
//		})
//		if err != nil {
//			return idempotency.Result{}, err // transient: not stored, a retry runs again
//		}
//		return idempotency.Result{Status: 201, Body: id}, nil // final: stored, replayed to retries
//	})
//
// For HTTP, [Keys.Handler] wraps an http.Handler: Idempotency-Key header,
// 409 while the first request runs, 422 for a key reused with another
// request, 400 for a missing or invalid key, replays marked
// Idempotent-Replayed: true.
//
// Each key (in its scope, [InScope]) has one record. The first request
// inserts it with its fingerprint and its claim (a lease on the record, see
// package lease), runs the function, and stores its result in the write that
// releases the claim: three round trips around the function; a replay is one
// read. A request that dies leaves its claim to expire after the TTL; the
// next retry runs the function again, resuming after the last checkpoint
// ([Call.Checkpoint], [Call.Step]: Stripe's atomic phases and recovery
// points). Records are kept for Options.Retention after their request last
// ran ([Keys.EnsureIndexes], [Keys.Sweep]). DESIGN.md derives the protocol.
//
// # Final and transient results
//
// A Func that returns a nil error has produced the request's final result,
// whatever its Status ("card declined" included): it is stored and every
// retry gets it. A Func that returns an error has failed transiently:
// nothing is stored, Do returns the error, the claim is released, and a
// retry runs the Func again, after the checkpoints already recorded.
// [Keys.Handler] decides by status (HTTPOptions.Final).
//
// # Events
//
// Options.Observer gets KeyCompleted, KeyReplayed, KeyInProgress and
// KeyMismatch (see package observe), and the claim's events from the lease
// Manager (operation "do").
//
// # Guarantees
//
// Given a server that applies single-document writes atomically, and the
// lease package's assumptions (clock drift below lease.Options.DriftRate,
// timers late by less than the safety margin, estimates of the server's
// clock within their bounds):
//
//   - The Func runs at most once per claim of a key, one claim holds a key
//     at a time, and the Func never runs once a result is stored: of any
//     number of concurrent requests with one key, exactly one runs; the
//     others get *InProgressError until it ends, then its stored result.
//   - A stored result is never replaced, and every later call with the key
//     and its fingerprint gets it until the record is deleted.
//   - A record is not deleted while a claim on it holds: each renewal (every
//     TTL/3) sets its retention time to the renewal's time plus Retention.
//     Once the claim ends, it is kept for Retention after its last write, at
//     least.
//   - The Func runs again only after the claim that ran it ended without a
//     result (the Func returned an error, its result was not final, or its
//     claim expired), and the new run sees every checkpoint recorded before.
//   - Checkpoints and results are written fenced on the claim: once a later
//     claim took the key over, a write of the earlier one changes nothing
//     and fails with ErrLost.
//   - A write whose reply was lost is settled by re-reading the record at
//     read concern majority; it is sent again only when the re-read shows
//     it missing.
//   - A step's function runs once per step name across the key's runs, also
//     when goroutines of one run call Step with that name at once, and its
//     partner key is the same in every run that resumes it.
//   - A key is compared by $eq only; keys CheckKey refuses, bad options, a
//     nil context or function are reported before anything is sent.
//
// A crash between a side effect outside the record and its checkpoint makes
// the retry repeat it: checkpoint each effect that must not repeat, and give
// partners Call.Step's partnerKey.
//
// # Errors
//
// Errors start with "idempotency: " and wrap their causes with %w. Nothing
// ran for *InProgressError (ErrInProgress,
// HTTP 409), *MismatchError (ErrMismatch, HTTP 422), bad input (ErrInvalid,
// *KeyError, *OptionsError: HTTP 400, nothing sent) and *RecordGoneError
// (ErrUnknownOutcome, HTTP 503). ErrLost: the claim ended before a result or
// checkpoint could be written under it. *UnknownOutcomeError
// (ErrUnknownOutcome): a write's outcome could not be settled; after the
// Func ran, a retry replays its result or runs again. The Func's own error
// is returned as it is (wrapped in a *lease.LostError when the claim was
// lost while it ran); an ended context, as a wrapped context error.
package idempotency

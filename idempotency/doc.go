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
// fingerprint of method, target and body, 409 with Retry-After while the
// first request runs, 422 for a key reused with another request, 400 for a
// missing or invalid key, and replays marked Idempotent-Replayed: true.
//
// Each key (in its scope, [InScope]) has one record. The first request
// creates it with its fingerprint, claims it with a lease on the record
// (package lease: one findOneAndUpdate, a TTL while it runs, renewed while
// the function runs, released at the end), runs the function and stores its
// result. A request that dies leaves its claim to expire after the TTL; the
// next retry claims the key and runs the function again, resuming after the
// last checkpoint it recorded ([Call.Checkpoint], [Call.Step]: Stripe's
// atomic phases and recovery points). The record, and the checkpoints, are
// kept for Options.Retention (24 h) after the request last ran: the
// renewals of a running request's claim move its retention time forward
// too, so a request may run longer than Retention
// ([Keys.EnsureIndexes], [Keys.Sweep]). A first request costs five round
// trips around the function (seven where the server lacks $expr), a replay
// two (the record's insert, refused, and a read).
//
// Leases and idempotency keys do not replace each other: a lease stops two
// different requests from interleaving on one resource; a key makes a retry
// of the same request safe. A partner call usually wants both. The protocol
// and its failure cases are derived in DESIGN.md beside this file.
//
// # Final and transient results
//
// A Func that returns a nil error has produced the request's final result,
// whatever its Status (a 4xx such as "card declined" included): it is stored
// and every retry gets it. A Func that returns an error has failed
// transiently (a 5xx, a partner that did not answer, a lost reply): nothing
// is stored, Do returns the error, the claim is released, and a retry runs
// the Func again, skipping the checkpoints already recorded. [Keys.Handler]
// decides by status with HTTPOptions.Final: by default 5xx, 408 and 429 are
// transient, everything else is final. A partner call whose reply was lost is
// repeated by the retry with the same partner key ([Call.Step]), so the
// partner can tell it is the same call.
//
// # Guarantees
//
// Given a server that applies single-document writes atomically, and the
// lease package's assumptions (clock drift below lease.Options.DriftRate,
// timers late by less than the safety margin):
//
//   - The Func runs at most once per claim of a key, one claim holds a key
//     at a time, and the Func never runs once a result is stored: of any
//     number of concurrent requests with one key, exactly one runs; the
//     others get *InProgressError until it ends, then its stored result.
//   - A stored result is never replaced, and every later call with the key
//     and its fingerprint gets it (Replayed), until the record is deleted
//     after Retention.
//   - A record is not deleted while a claim on it holds, however long its
//     request runs: each renewal of the claim (every TTL/3) sets the
//     record's retention time to the renewal's time plus Retention, in the
//     renewal's own write, and Retention is longer than TTL. Once the claim
//     ends, the record is kept for Retention after the last of its
//     request's writes (start, renewal, checkpoint, result), at least.
//   - The Func runs again only after the claim that ran it ended without a
//     result: the Func returned an error, its result was not final, or its
//     claim expired (the process died, or could not renew in time). The new
//     run sees every checkpoint recorded before.
//   - Checkpoints and results are written fenced on the claim (its owner,
//     epoch and claim id; on servers with $expr also its deadline): once a
//     later claim took the key over, a write of the earlier one changes
//     nothing and fails with ErrLost. So a run that was presumed dead cannot
//     record anything after its successor started.
//   - A write whose reply was lost (store.IsAmbiguous) is settled by
//     re-reading the record at read concern majority, never guessed: each
//     write is made so that a second copy changes nothing, so it is sent
//     again only when the re-read shows it missing. A checkpoint or step
//     start counts as this write's only if it carries this write's id.
//   - A step's function runs once per step name across the key's runs, also
//     when goroutines of one run call Step with that name at once (they run
//     one at a time; the later ones get the recorded data), and its partner
//     key is the same in every run that resumes it, whatever the order in
//     which concurrent steps began.
//   - A key is compared by $eq only; keys CheckKey refuses, bad options, a
//     nil context or function are reported before anything is sent.
//
// A Func's side effects outside the record are its own: a crash between a
// side effect and its checkpoint makes the retry repeat it. Put a
// checkpoint after each effect that must not repeat, and give the partner a
// key that stays the same across the retries (Call.Step's partnerKey).
//
// # Errors
//
// Errors start with "idempotency: " and wrap their causes with %w, so
// errors.Is and errors.As reach lease's, the driver's and the store
// classifiers' errors.
//
//   - *InProgressError, matching ErrInProgress: another request with the key
//     holds its claim; TimeLeft bounds how long it can without a renewal.
//     HTTP 409 with Retry-After. Nothing ran.
//   - *MismatchError, matching ErrMismatch: the key was first used with a
//     request of another fingerprint. HTTP 422. Nothing ran.
//   - *KeyError, matching ErrInvalidKey and ErrInvalid: a key (or scope) was
//     refused; ErrInvalid (*OptionsError, a nil context or function, a bad
//     checkpoint name): other bad input. HTTP 400. Nothing was sent.
//   - An error matching ErrLost (a *lease.LostError): the claim ended before
//     the result or a checkpoint could be written under it; nothing was
//     written by that call, and a retry runs the Func again.
//   - *UnknownOutcomeError, matching ErrUnknownOutcome: a write's reply was
//     lost and re-reading could not settle it. After the Func ran ("complete"),
//     its result may or may not be stored: a retry replays it, or runs again.
//   - *RecordGoneError, matching ErrUnknownOutcome (and lease.ErrNotFound):
//     the key's record was deleted between its open and its claim each of
//     the three times Do opened it. Nothing ran; a retry opens it afresh.
//     HTTP 503, as for any other store failure.
//   - The Func's own error, as it returned it (wrapped in a *lease.LostError
//     when the claim was lost while it ran).
//   - An error wrapping context.Canceled or context.DeadlineExceeded: the
//     context ended.
package idempotency

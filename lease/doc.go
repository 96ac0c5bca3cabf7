// Package lease gives one owner at a time a claim on a MongoDB document, or
// on a name, for work that is too slow or too external for a transaction: a
// call to a partner API, say, that must not run twice at once for the same
// user. The claim is a lease: it expires by itself after a TTL unless it is
// renewed, so a crashed holder never blocks anyone for longer than that. No
// transaction, lock or connection is held while the work runs.
//
//	m, err := lease.New(db.Collection("users"), &lease.Options{TTL: 30 * time.Second})
//	...
//	err = m.Do(ctx, userID, func(ctx context.Context, l *lease.Lease) error {
//		if err := partner.Relink(ctx, ...); err != nil { // stops when ctx ends
//			return err
//		}
//		_, err := users.UpdateOne(ctx, append(bson.D{{"_id", userID}}, l.Fence()...), change)
//		return err
//	})
//
// Do acquires (waiting while someone else holds the lease), renews in the
// background, cancels fn's context if the lease is lost, and releases when
// fn returns. TryAcquire fails at once with a *HeldError (holder, time left:
// a service can answer 409 with Retry-After); Acquire waits with jittered
// backoff; both return a *Lease to Renew and Release by hand.
//
// # The lease record
//
// The lease lives in a subdocument of the protected document, "_lease" by
// default (Options.Field), which the document's own model must not map (the
// versioned package never overwrites fields it does not map):
//
//	{_id: ..., <the user's fields>,
//	 _lease: {owner: "host/pid/random", epoch: 7, expiresAt: ISODate(...),
//	          acquiredAt: ISODate(...), claim: ObjectId(...)}}
//
// A claim is one findOneAndUpdate filtered on the _id and "no owner, or
// expired"; it sets owner, expiresAt, acquiredAt and a fresh claim id and
// $incs the epoch. A renewal is one updateOne filtered on _id, owner, epoch
// and an expiry earlier than the new one (so a delayed renewal never moves
// the expiry back); it sets expiresAt. A release is one updateOne filtered on
// _id, owner and epoch that unsets owner, expiresAt and claim. The epoch is
// never reset, so it is a fencing token that strictly increases per document
// across every holder. Only find, findOneAndUpdate, updateOne, deleteOne,
// $set, $unset, $inc and upsert are used, so the package also runs on
// servers without $expr or update pipelines, such as FerretDB v1.
//
// Named leases (NewNamed) are the same record on a lock document whose _id is
// the name, made by the first claim's upsert. Two first claims racing to
// create it end in a duplicate-key error for one of them, which is reported
// as ErrHeld. A release keeps the lock document (and so its epoch) and sets
// its expiresAt to the time of release. Stale lock documents are cleaned up
// by a TTL index where the server has them (Manager.EnsureIndexes); elsewhere
// Manager.Sweep deletes them, or they stay. A deleted lock document restarts
// its epoch at 1: see EnsureIndexes.
//
// # The clock
//
// Expiry is judged on the database server's clock, never on the application
// host's wall clock: a host whose clock is minutes off neither steals a live
// lease nor waits for a dead one. A store.Clock estimates the server's time
// from the localTime of hello replies plus the local monotonic time elapsed
// since; an estimate e says the server's clock reads within e.Bound of e.Time
// (half the round trip of the reading plus 1ms of localTime's resolution,
// plus the drift since the reading). All expiry math below uses only those
// estimates and differences of the local monotonic clock.
//
// A claimer takes the estimate e_C and treats a lease as expired only if
//
//	expiresAt < e_C.Earliest() = e_C.Time − e_C.Bound  (rounded down to 1ms)
//
// which holds only once the server's clock has passed expiresAt. A holder
// that sends a claim or renewal after local time t0, with an estimate e_H
// taken after t0, writes
//
//	expiresAt = e_H.Time + TTL  (rounded down to 1ms)
//
// and, once the server confirms the write, sets its local deadline to
//
//	deadline = t0 + (expiresAt − e_H.Latest()) − TTL×DriftRate − SafetyMargin
//
// At t0 the server's clock read at most e_H.Latest() = e_H.Time + e_H.Bound,
// and it gains at most DriftRate on the local clock, so it cannot reach
// expiresAt before deadline + SafetyMargin: the holder's context ends at
// least SafetyMargin before any claimer can see the lease as expired. The
// holder gives up e_H.Bound + TTL×DriftRate + SafetyMargin (+ <1ms rounding)
// of each TTL; with the defaults (SafetyMargin TTL/10, DriftRate 1e-4) and a
// local server that is about TTL/10 + 1ms. A crashed holder's lease is taken
// over at most TTL + e_H.Bound + 2×e_C.Bound + 1ms after its last write was
// sent, plus Acquire's polling, which sleeps the smaller of one backoff step
// and the time left.
//
// An exact mode, judging expiry inside the server with $$NOW where $expr and
// update pipelines exist, would remove the contender's bound; it is future
// work (store.Probe reports both capabilities).
//
// # Ambiguous writes
//
// A claim, renewal or release that fails with a network error or a timeout
// (store.IsAmbiguous) may have been applied. The lease then re-reads the
// record instead of guessing: a claim whose claim id is in the record was
// applied and is returned as held; a renewal whose expiry is in the record
// was applied; a release whose owner is gone (and whose epoch is unchanged,
// or was advanced by a later claim before this lease's deadline) was
// applied, and one whose owner is still there is sent again. If the re-read
// fails too, the error is a *UncertainError and the lease errs on the safe
// side: an uncertain claim or release leaves the lease held until it
// expires, never held twice.
//
// # Guarantees
//
// A lease gives efficiency, not correctness. It keeps two owners from doing
// the same work at once as long as the holder stops when its context ends;
// but a holder paused past its deadline (a GC pause, a stalled network, a
// blocking call that ignores its context) can still act after another owner
// took over. Correctness needs the fencing token: make every write under the
// lease conditional on the lease's owner and epoch (Lease.Fence for the
// driver, Lease.Guard for the versioned package), so that a stale holder's
// write matches nothing and changes nothing. External systems that accept a
// token should be given the epoch and reject smaller ones.
//
// Given a server that applies single-document writes atomically (MongoDB; or
// FerretDB behind mongotest's serializing proxy), write concern majority and
// primary reads on a replica set (store.ClientOptions sets both), clock
// estimates within their bounds, a drift below DriftRate, and timers late by
// less than SafetyMargin:
//
//   - At most one owner holds the lease on a document or name at any time:
//     of any number of concurrent claims, exactly one succeeds.
//   - The epoch after each claim is greater than after every earlier claim
//     of the same document (for a named lease: since its lock document was
//     created).
//   - A holder's context ends before any other owner can claim its lease.
//   - A lease whose holder stopped renewing is claimable once its TTL has
//     passed on the server's clock, whatever any host's wall clock says.
//   - Release, Renew and fenced writes of a lease that was lost change
//     nothing and report ErrLost.
//   - Invalid options, an invalid id and an ended context are reported
//     before anything is sent: nothing is written.
//   - Do starts one goroutine, which ends before Do returns; a Lease's
//     deadline timer is stopped when the lease ends.
//
// # Errors
//
// Every error names the package ("lease: ...") and wraps its cause with %w,
// so errors.Is and errors.As reach the driver's errors and the classifiers of
// the store package still work.
//
//   - *OptionsError, matching ErrInvalidOptions: New or NewNamed got an
//     Options field out of range (TTL zero or negative, a blank Owner, a
//     Field starting with "$" or containing ".", ...); also a nil collection,
//     and Do with a nil function.
//   - ErrInvalidID: the id is nil, an empty string, a zero ObjectID or a nil
//     pointer, map or slice.
//   - An error wrapping context.Canceled or context.DeadlineExceeded: the
//     context had ended before the call; nothing was sent.
//   - ErrNotFound: a document lease on an _id no document has. Nothing is
//     created.
//   - *HeldError, matching ErrHeld: another owner (or this Manager, from
//     another goroutine) holds a live lease; it carries the holder, its epoch,
//     the expiry and the time left.
//   - *LostError, matching ErrLost: the lease is no longer held by this
//     owner, for its Reason: Expired (the local deadline passed without a
//     renewal), TakenOver (the record has another owner or epoch) or Cleared
//     (the record was cleared or the document deleted by someone else). It is
//     the context.Cause of a lost lease's context, and what Renew and Release
//     return once the lease is lost. Do returns it wrapping fn's error when
//     the lease was lost while fn ran: it then matches fn's error too. A
//     write fenced with Guard that fails returns the versioned package's
//     *GuardError, which matches ErrLost.
//   - ErrReleased: Renew or Release of a lease already released; also the
//     cause of a released lease's context.
//   - *UncertainError, matching ErrUncertain: a write failed ambiguously and
//     the re-read failed too; it unwraps to both errors.
//   - store.ErrNoServerTime (wrapped): the server's clock could not be read,
//     so nothing was claimed or renewed.
//   - ErrNotNamed: EnsureIndexes or Sweep on a Manager made by New.
//   - Any other driver error, wrapped: the claim, renewal or release failed
//     without being applied (for a renewal, the lease stays held until its
//     deadline; for a release, until it expires).
//
// Acquire returns, when its context ends, an error wrapping both the
// context's error and the last attempt's (often a *HeldError). Do returns
// the error of acquiring, or else fn's error, wrapped in a *LostError if the
// lease was lost, or joined with the release's error if releasing failed.
package lease

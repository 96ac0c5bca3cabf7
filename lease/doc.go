// Package lease gives one owner at a time a claim on a MongoDB document, or
// on a name, for work that is too slow or too external for a transaction: a
// call to a partner API, say, that must not run twice at once for the same
// user. The claim expires by itself after a TTL unless it is renewed, so a
// crashed holder never blocks anyone for longer than that. No transaction,
// lock or connection is held while the work runs.
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
// [Manager.Do] acquires (waiting while someone else holds the lease), renews
// in the background, cancels fn's context if the lease is lost, and releases
// when fn returns. [Manager.TryAcquire] fails at once with a [*HeldError]
// (holder, time left: a service can answer 409 with Retry-After);
// [Manager.Acquire] waits; both return a [*Lease] to Renew and Release by
// hand, or to renew in the background with [Lease.KeepAlive].
//
// A document lease ([New]) keeps its record in a subdocument of the leased
// document ("_lease", Options.Field), which the document's own model must not
// map. A named lease ([NewNamed]) keeps it in a lock document whose _id is
// the name, and protects other documents by stamping its epoch into them
// ([Lease.Stamp], then [Lease.Fence] on each write). Fence is a plain
// filter: add it to a driver write's filter, or to a write of the versioned
// package with versioned.WhereErr, which then reports a lost lease as ErrLost:
//
//	err := repo.Update(ctx, &user, versioned.WhereErr(l.Fence(), lease.ErrLost))
//
// Expiry is judged on the server's clock, never on the application host's:
// with $$NOW where the server has $expr and update pipelines ([ModeServer]),
// else from an estimate of the server's clock ([ModeEstimated], for FerretDB
// v1). [ModeAuto] chooses by trying. DESIGN.md beside this file derives the
// holder's deadline, the epochs, and what fencing can and cannot promise.
//
// # Costs
//
// A claim is one findAndModify; a release one update; Do adds one renewal
// every RenewEvery. A first lease costs one write more in ModeEstimated (its
// first epoch), and a name's first a read and an upsert in ModeServer. A
// call waiting for another process's holder reads the record once to learn
// when that lease is up and sleeps until then, with one claim half-way
// while more than four backoff steps are left: four commands for a crashed
// 1 s holder. Calls of one process wait in line, sending nothing
// ([Manager.Acquire]).
//
// On a collection sharded on a key other than _id, see [Options].ShardKey
// and [Key]: every command then names the document's shard.
//
// # Guarantees
//
// Given a server that applies single-document writes atomically, write
// concern majority and primary reads on a replica set or sharded cluster
// ([store.ClientOptions] sets both), a server clock that gains less than
// DriftRate on the local one (in ModeEstimated: clock estimates within their
// bounds), and timers late by less than SafetyMargin:
//
//   - At most one owner holds the lease on a document or name at any time:
//     of any number of concurrent claims, exactly one succeeds.
//   - A holder's context ends before any other owner can claim its lease.
//     Its local deadline is at most TTL after it sent its last applied
//     claim or renewal, whatever the clock estimate says.
//   - Epochs strictly increase per document or name, by one per claim, even
//     across the document's deletion and re-insertion or the clean-up of a
//     lock document: the first epoch of a record is the server's time in
//     microseconds + 1, and no Lease is handed out with another.
//   - Fence matches nothing once the [Lease] knows it was released or lost
//     (its Err is not nil). A document lease's fenced write matches only
//     while the record names this Lease (owner, epoch and claim id: two
//     Leases never share a fence). A named lease's matches only while the
//     protected document's stamp is this holder's epoch: a write by a holder
//     that does not yet know it lost, racing a new holder that has not
//     stamped yet, still applies, ordered before that stamp. Stamp before
//     the first write.
//   - In ModeServer a fenced write also fails once the holder's local
//     deadline has passed; in ModeEstimated one made after it, before anyone
//     else claimed (or stamped), still applies, ordered before every write
//     of any later holder.
//   - With Options.Retain, each applied renewal of a document lease has set
//     that field to at least the server's time plus RetainFor, in the
//     renewal's own write.
//   - Bad input (options, ids, a nil context) and an ended context are
//     reported before anything is sent. Ids are checked by [store.CheckID]
//     and compared with $eq: an id such as {"$gt": ""} is refused.
//   - The lease's own commands never use a session or transaction carried
//     by the caller's context (Stamp uses it).
//   - After an ambiguous write the record is re-read (for up to
//     ResolveTimeout) at read concern majority, so a claim a replica set
//     later rolls back never counts as held; only a release or stamp is sent
//     again. Acquire holds the lease when a re-read shows its own earlier
//     claim, and claims again if that claim's deadline has passed.
//   - Acquire and Do calls for one lease in one process are served first
//     come, first served, through a line shared by every Manager on the same
//     collection and lease field of the same *mongo.Client; when the lease
//     a call got ends, the next claims at once. Across processes claims race.
//   - Do starts one goroutine, which ends before Do returns; a Lease's
//     deadline timer is stopped when the lease ends.
//
// A lease gives efficiency, not correctness, on its own: a holder paused past
// its deadline can still act. Correctness needs the fencing token on every
// write (Fence), or an external system that rejects smaller epochs.
//
// # Errors
//
// Errors start with "lease: " and wrap their cause with %w, so errors.Is and
// errors.As reach the driver's errors and the store classifiers still work.
//
//   - [ErrInvalid] ([*OptionsError], a nil context or function) and
//     [ErrInvalidID] (an id store.CheckID refuses, a [Key] without every
//     shard-key value, a bare id where Options.ShardKey is set): nothing was
//     sent.
//   - An error wrapping context.Canceled or context.DeadlineExceeded: the
//     context had ended.
//   - [ErrNotFound]: a document lease (or Stamp) on an _id no document has.
//   - [*HeldError], matching [ErrHeld]: another owner (or this Manager, from
//     another goroutine) holds a live lease.
//   - [*LostError], matching [ErrLost]: the lease is no longer held, for its
//     [Reason]; the cause of a lost lease's context. Do wraps fn's error in
//     it when the lease was lost while fn ran.
//   - [ErrReleased]: Renew or Release of a released lease.
//   - [*UnknownOutcomeError], matching [ErrUnknownOutcome]: a write failed
//     ambiguously and could not be settled. No two owners can hold the
//     lease because of it.
//   - [store.ErrNoServerTime] (wrapped): ModeEstimated could not read the
//     server's clock, so nothing was claimed or renewed.
//   - [ErrNotNamed]: EnsureIndexes or Sweep on a Manager made by New.
//   - Acquire stopped by its context or by Options.Retry (retry.ErrExhausted,
//     retry.ErrBudgetExhausted) wraps that and the last attempt's error
//     (often a [*HeldError]).
package lease

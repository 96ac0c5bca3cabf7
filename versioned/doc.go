// Package versioned stores documents of a Go struct type in MongoDB with
// optimistic concurrency control: many writers can change the same document
// at once without losing an update or applying one twice, even when replies
// are lost.
//
// A [Repo] wraps the caller's *mongo.Collection. T names its id with
// bson:"_id" and an int64 version with bson:"version"; the repository owns
// the version (reads fill it in, writes raise it by one). Versions are
// opaque: Insert starts each document at a random version below 2^52 (so
// that it stays exact in JavaScript and JSON clients), which makes the
// version name the document's incarnation as well as its state. Compare
// versions for equality only; do not assume they start at 1 or count
// writes from 1:
//
//	type Account struct {
//		ID      string `bson:"_id"`
//		Balance int64  `bson:"balance"`
//		Version int64  `bson:"version"`
//	}
//
//	accounts, err := versioned.New[Account](db.Collection("accounts"), nil)
//	// Read-modify-write, retried on conflict:
//	acct, err := accounts.Modify(ctx, "ana", func(a *Account) error {
//		a.Balance += 10
//		return nil
//	})
//	// One atomic statement, no conflicts: "take 3 if at least 3".
//	acct, err = accounts.Guarded(ctx, "ana",
//		bson.D{{"balance", bson.D{{"$gte", 3}}}},
//		bson.D{{"$inc", bson.D{{"balance", -3}}}})
//
// [Repo.Insert], [Repo.Get], [Repo.Update] (write back a copy if its version
// is still the stored one) and [Repo.Delete] complete the set. Update,
// Delete, Modify and Guarded take [WriteOption]s: [Where] and [WhereErr] add
// conditions to the write's filter (a lease's fence, say), [WithSet] sets
// fields the model does not own in the same statement (Update, Modify and
// Guarded), [WithRetry] sets one call's retry policy.
//
// Writes are diffs ($set, $unset, $inc), never replacements: fields T does
// not map survive. Every write also records its write id in the document
// (the subdocument [Options].MetaField, "_mc"), bounded to the last
// [WriteIDs] ids by the write itself; after an ambiguous failure the
// repository re-reads and looks for it. A document whose "_mc" another
// program left unusable (null, not a document, or a list of ids that is not
// an array) is written as one without it: the write sets "_mc" afresh. How
// and why this is safe is in DESIGN.md, beside this file.
//
// Modify calls on one document in one process wait in line, and the call
// at the head combines itself and the calls behind it into one read and one
// write ([Repo.Modify]); across processes the version check arbitrates.
// Modify's default policy retries conflicts for up to [DefaultRetryTime]
// within a budget per Repo ([DefaultRetryBudget]), with no bound on attempts.
//
// # Sharded collections
//
// On a collection sharded on a key other than _id, name the shard key's
// fields in [Options].ShardKey: every command the repository sends then
// filters on the _id and on each of them, so that mongos sends it to the
// one shard that owns the document. Get, Modify and Guarded then take a
// [Key] as the id:
//
//	repo, err := versioned.New[Account](coll, &versioned.Options{ShardKey: []string{"region", "accountId"}})
//	acct, err := repo.Get(ctx, versioned.Key{ID: "acct-7", Shard: bson.D{
//		{Key: "region", Value: "eu"}, {Key: "accountId", Value: int64(7)},
//	}})
//
// A repository never changes a stored document's shard key (an
// [*InvalidError], nothing sent): that moves the document to another shard,
// which MongoDB allows only in a transaction or as a retryable write through
// mongos. The guarantees below hold on a sharded cluster as on a replica
// set, with write concern majority and primary reads (store.Connect's
// defaults).
//
// # Guarantees
//
//   - No lost update: Update, Delete and Modify apply only if the stored
//     version is the one they expect; every change raises the version by
//     exactly one in the same atomic statement as the change: a write,
//     Guarded included, by one, and a write combining k Modify calls'
//     changes by k, each call getting the version one above the state its
//     fn saw.
//   - At most once: a write whose outcome was ambiguous (network error,
//     timeout, write-concern error, RetryableWriteError label) is applied at
//     most once. The call reports success only if it was applied, and
//     otherwise an error saying it was not, or an [*UnknownOutcomeError]
//     when the re-read cannot tell (for instance when more than [WriteIDs]
//     writes landed since, or the document was deleted meanwhile). Modify
//     never runs fn again after a write it could not settle. The re-read
//     uses read concern majority, so a write reported landed is one no
//     replica-set rollback can undo (a server that refuses majority reads,
//     and so has no such rollback, is read at its default).
//   - A document deleted and inserted again is never taken for the old one,
//     by any repository, whatever it has seen: a copy of the old document
//     (its version) never matches the new one, since their versions come
//     from independent random starts (the chance that they meet is about
//     (k+j+1)/2^52 for k and j writes to each; see DESIGN.md). This holds for
//     documents Insert created. A document another program inserts without
//     a version (version 0) or with small versions has no such start: a
//     copy of it can match a re-inserted one at the same version, as with
//     any version counter.
//   - Modify's fn sees the state it replaces, and writes only the fields it
//     changed (compared as Go values). fn may run several times. In a
//     combined write a call reports success only if the write holding its
//     change landed; an error from one fn, or a change that cannot be
//     written, affects only its own call: nothing of it is written, and the
//     next fn sees the state before it ([Repo.Modify]).
//   - Guarded's condition and change are one atomic statement.
//   - Bad input is refused before anything is sent: ids are compared with
//     $eq and an id that could act as an operator is refused; field names
//     with '$' or '.', documents over 16 MiB, the id, the version, the
//     write-id field and reserved fields (Options.Reserved, the lease record
//     by default) cannot be written through Guarded or Modify. A version
//     never wraps: a copy whose version is negative or above
//     math.MaxInt64-1 is refused, and no write raises math.MaxInt64-1.
//   - Write ids take at most [WriteIDs] entries per document, whoever writes:
//     the version and the metadata take about 230 bytes.
//   - Inside a transaction every call takes part in it; Modify makes one
//     attempt, and an ambiguous error is returned as it is, for the
//     transaction's own retry loop.
//   - A Repo is safe for concurrent use and starts no goroutine.
//
// These rest on MongoDB's single-document atomicity. The mongotest
// package's embedded FerretDB backend provides it only behind its
// serializing proxy, and ignores $slice: there the writes that pin a
// version keep the list of write ids bounded (see DESIGN.md).
//
// # Errors
//
// Messages start with "versioned: "; driver errors are wrapped with %w.
// Match with errors.Is and errors.As:
//
//   - [ErrConflict], [*ConflictError]: the stored version is not the
//     expected one. Retryable: [retry.Do] retries it.
//   - [ErrNotFound], [*NotFoundError]: no document has the id.
//   - [ErrGuardFailed], [*GuardError]: Guarded's cond or a Where filter
//     does not hold. A failed [WhereErr] filter also matches its own error,
//     and wins over a moved version (a lost lease is not a conflict).
//   - [ErrDuplicate], [*DuplicateError]: Insert of an existing id, or a
//     unique index violation.
//   - [ErrInvalid], [*InvalidError], [*VersionTypeError]: bad input, nothing
//     sent; [ErrInvalidID] too for a bad id (or [Key]: a missing or
//     operator-shaped shard-key value, a bare id where Options.ShardKey is
//     set). A write that would change a shard key is ErrInvalid. A stored version that is not an
//     integer from 0 to math.MaxInt64-1 is a *VersionTypeError; a write that
//     would raise the version past math.MaxInt64-1 is an *InvalidError. The
//     same values as the store package's, in every mongocas package.
//   - [ErrUnknownOutcome], [*UnknownOutcomeError]: the outcome of an
//     ambiguous write could not be settled. Not retryable; read the document
//     to see its state.
//   - A context that ended: the context's error (context.Canceled or
//     context.DeadlineExceeded), wrapped, never ErrInvalid. A nil context
//     is ErrInvalid.
//   - fn's error from Modify, wrapped; other driver errors, wrapped.
package versioned

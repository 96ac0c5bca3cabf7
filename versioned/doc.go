// Package versioned stores documents of a Go struct type in MongoDB with
// optimistic concurrency control, so that many writers can change the same
// documents at once without losing an update, applying one twice, or taking
// a balance or a stock below zero.
//
// A Repo[T] wraps the caller's *mongo.Collection:
//
//	type Account struct {
//		ID      string `bson:"_id"`
//		Balance int64  `bson:"balance"`
//		Version int64  `bson:"version"`
//	}
//
//	accounts, err := versioned.New[Account](db.Collection("accounts"), nil)
//
// and offers, each in one round trip unless stated:
//
//   - Insert: a new document at version 1; an existing id is ErrDuplicate.
//   - Get: the document by id, with its version.
//   - Update: write back a copy the caller holds, if the stored version is
//     still the copy's: one updateOne filtered on the id and that version.
//   - Delete: remove it under the same version check.
//   - Modify: read-modify-write: read, call fn on the fresh copy, write the
//     difference back under the version check; on a conflict read again
//     and call fn again, with jittered backoff (the retry package). Two
//     round trips per attempt.
//   - Guarded: the caller's condition and update operators plus the version
//     bump in one statement (findOneAndUpdate), for hot counters: "take 3
//     from stock if stock >= 3". No version is read, so nothing conflicts.
//
// Update, Delete, Modify and Guarded take WriteOptions: Where and WhereErr
// add conditions to the write's filter (the lease package uses them to fence
// writes on a lease's owner and epoch), WithRetry sets the retry policy of
// one call.
//
// # Id and version
//
// New reflects over T once and finds, as the driver's default struct codec
// names fields (the bson tag, or else the lowercased Go name; "-" skips a
// field; "inline" flattens an embedded struct):
//
//   - the id: the field mapped to "_id", of any type the driver encodes.
//     Calls that take an id take a value of that type (an integer of
//     another integer type is converted when it fits); nil, the zero value
//     or another type is ErrInvalid. The repository never generates ids.
//   - the version: an int64 field mapped to Options.VersionField ("version"
//     by default). The repository owns it: reads fill it in, successful
//     writes advance it, and values the caller puts in it are ignored except
//     by Update and Delete, which expect the stored version to equal it.
//
// A stored document with no version field is at version 0, so documents
// written before the repository was adopted can be read and updated; the
// first write gives them version 1. A stored version must be an integer (a
// double holding an integer, as mongosh writes numbers, is accepted); any
// other value is a *VersionTypeError and the document is not written.
//
// Reflection rather than an interface (GetVersion/SetVersion methods, say):
// the model stays a plain struct with the bson tags it has anyway, there is
// nothing to implement or to get wrong, and the cost is paid once, in New.
// T must not have its own BSON marshaler or an inline map (the repository
// must know which fields T maps), nor map Options.MetaField. Documents are
// encoded with the driver's default registry.
//
// # Diffs, never replaces
//
// No operation replaces a whole document. Update $sets every field T maps
// and $unsets the mapped fields the copy omits (omitempty fields at their
// zero value, say); Modify, which holds the document as read, $sets only
// the fields whose encoding changed and $unsets only those fn removed;
// Guarded applies the caller's operators. Fields T does not map — a lease
// subdocument, fields another service writes — survive every operation. The
// granularity is the top-level field: a changed subdocument is $set whole.
//
// # Write ids
//
// A write whose reply is lost (a network error or a timeout after the
// request was sent) may or may not have been applied, and on a standalone
// server, or with retryable writes off, the driver cannot tell. To find out,
// every write stamps a fresh write id (128 random bits) into the document,
// in the subdocument Options.MetaField ("_mc" by default):
//
//	{"_mc": {"w": {"<write id>": <base version>, ...}}}
//
// The base version of a write is the version it was made against: the
// version its filter requires for Insert (0), Update, Delete and Modify;
// for Guarded, which requires none, a version the document had at or
// before the write, taken from what the repository last saw of the document
// (or one read first), and Guarded's filter requires the version to be at
// most base+History and its own write id to be absent.
//
// A write also removes ("prunes") the write ids that nobody needs any more,
// among those the repository knows of: the ids of its own earlier writes
// whose outcome it has reported (for Guarded, only if sent once, so that no
// other copy is in flight), and any id whose base version is more than
// Options.History (32) below a version it has seen the document at. Hence,
// while a write's outcome is not yet known, its id stays in the document
// until the document is more than History versions past the write's base.
// After a lost reply the repository re-reads the document and decides:
//
//   - the write id is there: the write landed; report success.
//   - it is not, and the document is more than History versions past the
//     base: the id may have been pruned; report *UnknownOutcomeError,
//     never guess.
//   - it is not, and the write can no longer apply (the version moved past
//     the version a compare-and-set write requires): it did not land and
//     never will; Update and Delete report the conflict, Modify retries.
//   - it is not, but a copy of the request may still be in flight and
//     land later (the version is still the base): send the same write, with
//     the same write id, again. Every copy's filter lets at most one of them
//     apply (the version check, or for Guarded the absence of its write id
//     together with the version bound, which pruning cannot outrun), so
//     the change is applied once.
//
// This needs only $set and $unset of dotted paths, which every target server
// runs. A document written by one repository carries one write id (about 40
// bytes) plus one per write in flight; with several repositories (processes)
// writing it, ids of the others' writes linger for up to History versions.
// Share one Repo per collection in a process: writes that do not read the
// document (Update, Guarded) prune what the repository last saw of it.
// Pruning by version, rather than by time, keeps the decision free of
// clocks; it assumes versions never go back, which is why what is read or
// written inside a transaction does not count (the transaction may abort),
// and why a replica set should write with majority write concern (the
// store package's default) so that no acknowledged version is rolled back. The limit: an outcome is learned only if fewer than History
// writes landed between the lost write and the re-read; raise History for
// documents written by many writers at once.
//
// A delete leaves no document to stamp: a Delete whose reply is lost and
// whose document is gone on re-read is reported as done, whoever removed it.
//
// # Guarantees
//
//   - No lost update: Update, Delete and Modify apply only if the stored
//     version is the one they expect, and every write, Guarded included,
//     raises the version by exactly one, in the same single-document
//     atomic statement as the change.
//   - Exactly once: a write whose reply is lost is applied at most once,
//     and the repository reports success if and only if it was applied;
//     when it cannot tell, it returns *UnknownOutcomeError and does not
//     retry.
//   - Modify's fn always sees the state it is about to replace: fn runs on
//     a copy read in the same attempt, and the write applies only if the
//     version has not moved since that read. fn may run several times. An
//     error from fn, or a bad document from it, writes nothing.
//   - Guarded's condition and change are one atomic statement: with a
//     condition such as {"stock": {"$gte": 3}} and $inc of -3, stock never
//     goes below zero, whatever the concurrency.
//   - Fields T does not map are never changed or removed, and neither is
//     anything outside the document's own fields except its version and
//     write ids.
//   - Bad input (see ErrInvalid) is refused before anything is sent.
//   - Inside a transaction (a session carried by ctx with a transaction in
//     progress), every operation uses ctx and so takes part in it; Modify
//     makes one attempt and returns a conflict for the transaction's own
//     retry loop, and a lost reply is returned as it is, since the
//     transaction is then the unit to retry.
//   - A Repo is safe for concurrent use. Its calls start no goroutine.
//
// The guarantees rest on MongoDB's single-document atomicity (a filter and
// an update are evaluated together). The mongotest package's embedded
// FerretDB backend provides it only behind its serializing proxy.
//
// # Errors
//
// Every error's message starts with "versioned: ". Driver errors are
// wrapped with %w, so errors.As reaches the driver's types. The sentinels,
// matched with errors.Is, and the typed errors that carry the facts:
//
//   - ErrConflict, *ConflictError (Op, ID, Expected, Current): the stored
//     version is not the expected one. Retryable (its Retryable method
//     reports true), so retry.Do retries it. Modify returns it, also
//     matching retry.ErrExhausted or retry.ErrBudgetExhausted, when its
//     retries run out; Guarded only if the document moved more than History
//     versions during each of its few tries.
//   - ErrNotFound, *NotFoundError (Op, ID): no document has the id.
//   - ErrGuardFailed, *GuardError (Op, ID, Version, Err): the document
//     exists, at the expected version for writes that expect one, but did
//     not match Guarded's cond or a Where filter. If the failing filter was
//     given with WhereErr, the error also matches that filter's error.
//   - ErrDuplicate, *DuplicateError (Op, ID, Err): Insert of an existing
//     id, or any write that would duplicate a unique index key.
//   - ErrInvalid, *InvalidError (Op, Field, Reason, Err): bad input, refused
//     before anything is sent: a nil document or fn, a nil, zero or
//     mistyped id, a field name (at any depth, map keys included) that
//     starts with '$' or contains '.', a document over 16 MiB, an update
//     operator Guarded does not allow or a path it may not touch, fn
//     changing the id, a bad T or Options field in New, a nil context, or a
//     context that had ended before the call (the error then also matches
//     context.Canceled or context.DeadlineExceeded). String values that
//     start with '$' are stored as the literal strings they are.
//   - ErrInvalid, *VersionTypeError (Op, ID, Field, Value): the stored
//     version is not a non-negative integer; nothing is written.
//   - ErrUnknownOutcome, *UnknownOutcomeError (Op, ID, WriteID, Base,
//     Current, Reason, Err): a write's reply was lost and the re-read could
//     not settle whether it landed (see "Write ids"). Not retryable: a
//     blind retry could apply the change twice. It unwraps to the driver's
//     error.
//   - An error from Modify's fn, wrapped.
//   - Other driver errors (a server error, a network error on a read, an
//     error that stopped the retries of Modify), wrapped; a context that
//     ended during Modify's retries matches context.Canceled or
//     context.DeadlineExceeded.
package versioned

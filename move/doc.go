// Package move moves value (a balance, a stock count) from one document to
// another exactly once, on every MongoDB-compatible server, without a
// transaction: the two-step move that MongoDB's manuals describe by hand,
// with the pending half recorded in the source document.
//
//	q, err := deferred.New(db.Collection("jobs"), nil)
//	mover, err := move.New(ctx, q, db.Collection("accounts"), &move.Options{Field: "balance"})
//	go q.Run(ctx) // in every process that relays moves
//
//	id, err := mover.Move(ctx, "ana", "ben", 30, nil)
//	switch {
//	case errors.Is(err, versioned.ErrGuardFailed): // ana has less than 30: nothing moved
//	case err != nil:
//	default: // 30 left ana; ben gets it, or ana gets it back
//	}
//	st, err := mover.Status(ctx, "ana", id) // move.Pending, move.Done, move.Returned
//
// Move's debit is one statement on the source (versioned.Repo.Guarded): it
// checks that the value is at least the amount (and the caller's
// condition), takes it, and records a pending entry, in one round trip.
// A relay job in the deferred queue (keyed by the target) then credits the
// target exactly once, recording a marker there in the same statement, or,
// if the target is missing, does not match Options.Accept or cannot hold
// the credit (its value is not a number, or would pass the largest int64),
// returns the value to the source exactly once. Then the pending entry, the outcome and
// the marker are cleaned up. Sweep, run periodically by at least one
// process, relays moves whose process died before it enqueued. Unsettled
// lists what is in flight or not yet cleaned up, oldest first (mongocas
// moves prints it); Options.Observer receives each debit and settlement
// (package observe).
//
// # Many moves, all or nothing
//
// MoveAll makes several moves or none: an order that reserves 2 mugs and 1
// kettle, each a step from an item to the order.
//
//	saga, err := mover.MoveAll(ctx, []move.Step{
//		{From: "mug", To: "order-17", Amount: 2},
//		{From: "kettle", To: "order-17", Amount: 1},
//	})
//	switch {
//	case errors.Is(err, versioned.ErrGuardFailed): // an item is short (StepError says which): nothing moved
//	case err != nil:
//	default: // every item is reserved; the relay credits order-17
//	}
//
// Each step's debit records the saga in its pending entry, and its target
// is prepared (it exists, matches Options.Accept and can hold the credit). Then the saga is
// decided once, in the outcomes collection: done if every debit and
// preparation landed, returned otherwise. Nothing is credited before the
// decision; a returned saga's debits go back to their sources (MoveAll
// sends them back before it returns; the relay returns any that lands
// later). A MoveAll whose process dies before it decides is decided
// returned by the relay once Sweep finds its debits (after Options.Grace):
// Grace bounds how long a MoveAll may take. SagaStatus reads the decision.
//
// # Guarantees
//
// Given MongoDB's single-document atomicity and the deferred and versioned
// packages' guarantees, for documents written only through this package and
// versioned (every write raises the version):
//
//   - Exactly once: a move that debited its source is, in the end, credited
//     to the target exactly once or returned to the source exactly once,
//     never both, however often replies are lost, copies of its writes are
//     held in the network and delivered late, relay jobs are duplicated, or
//     processes die between any two of its writes (with Sweep running).
//     Status says which.
//   - Conservation: over a set of documents closed under the moves among
//     them, the sum of the values plus the pending entries not yet credited
//     (Total.Sum) is the same at every instant. Sum reads it.
//   - All or nothing: a saga's decision is made once; decided done, every
//     step is credited exactly once (unless its target is deleted); decided
//     returned, none is credited and every debit that landed is returned
//     exactly once.
//   - No value goes below zero through a move: the debit requires the value
//     to be at least the amount.
//   - Bad input is refused before anything is sent: ids are checked by
//     store.CheckID, field names may not start with '$' or hold '.'; every
//     field this package writes under Options.StateField is named by a move
//     id's hex digits, never by input.
//
// A document deleted while a move to or from it is unsettled leaves the set:
// its value, and the move's, go with it. A source deleted (or replaced)
// after its move's target was marked and before the relay recorded the
// move's outcome leaves the target's marker (Unsettled lists it) until the
// source is back with its entry: the marker is what tells the relay the move
// was credited. Each Sweep then adds a relay job for it that ends at once
// with nothing done, holding back no other job of the target. The
// derivation is in DESIGN.md beside this file.
//
// # Errors
//
// Messages start with "move: "; versioned's and the driver's errors are
// wrapped with %w. Match with errors.Is and errors.As:
//
//   - ErrInvalid, *InvalidError: bad input, nothing sent (store.ErrInvalid).
//   - From Move: versioned.ErrGuardFailed (*versioned.GuardError) when the
//     source's value is below the amount or its condition fails;
//     versioned.ErrNotFound when the source does not exist;
//     versioned.ErrUnknownOutcome when the debit's outcome could not be
//     settled (the move's id comes with it). Nothing moved for the first
//     two.
//   - From MoveAll: a *StepError matching ErrAborted and the step's error
//     (versioned.ErrGuardFailed: a source short or its Cond false, or a
//     target not matching Options.Accept or unable to hold the credit;
//     versioned.ErrNotFound: a missing
//     source or target; versioned.ErrUnknownOutcome: a debit or preparation
//     not settled; the context's error), with Step -1 when the relay decided
//     first; versioned.ErrUnknownOutcome (not ErrAborted) when the decision
//     itself could not be written or read: SagaStatus tells. Check
//     ErrAborted first: a StepError also matches its step's
//     ErrUnknownOutcome, yet the saga is returned. Outcome records must
//     outlive their moves: a deleted decision would be decided again, and
//     a target's marker whose move's record is deleted stays for ever.
//   - From Status: ErrNotFound for a move neither the source nor the
//     outcomes collection knows; from SagaStatus, for a saga not decided.
//   - From Sum: versioned.ErrConflict when Options.Collects reads never
//     agreed (the documents kept changing).
//   - A context that ended: the context's error, wrapped.
package move

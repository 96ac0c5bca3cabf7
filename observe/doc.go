// Package observe is the one event surface of mongocas: what the versioned,
// lease and retry packages (and store's server clock) tell an operator about
// the work they do. Give an [Observer] to a repository or a lease manager,
// and it sees each operation start and end with its outcome, each version
// conflict, each retry, each retry a budget refused, each write whose reply
// was lost and how it was settled, and each lease acquired, renewed, lost,
// released or found held by another owner:
//
//	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
//	repo, err := versioned.New[Account](coll, &versioned.Options{Observer: observe.Slog(logger)})
//	leases, err := lease.New(users, &lease.Options{TTL: 30 * time.Second, Observer: observe.Slog(logger)})
//
// A deferred.Queue reports the life of its jobs (enqueued, claimed, completed,
// failed, dead, snoozed, requeued, cancelled) and what its workers could not
// return to anyone (QueueError, QueueKeySkipped); idempotency.Keys reports
// each request that completed, was replayed, found its key in progress or
// reused with another request. These are events without OpStart and OpEnd:
// each says what became of a job or a request, with the outcome where an
// attempt ends.
//
// Three Observers come with it: [Slog] logs through a *slog.Logger, quiet at
// Info in normal operation and warning of a lost lease or an unknown
// outcome; [Counters] counts events in memory; [Join] sends each event to
// several. The OpenTelemetry adapter (spans with the database semantic
// conventions, and metrics) is a module of its own,
// github.com/mongocas/mongocas/otelmongocas, so that this module keeps
// depending on the driver and backoff only. A test can record the events in
// a slice and compare the sequence exactly.
//
// The same field name everywhere: versioned.Options.Observer,
// lease.Options.Observer, deferred.Options.Observer,
// idempotency.Options.Observer, retry.Policy.Observer and
// store.ServerClockOptions.Observer. A queue and Keys pass theirs on to the lease
// managers they make (and their retry policies). A repository or manager passes its Observer
// on to its retry policy (when the policy has none) and a manager to the
// server clock it makes, so one field sees everything.
//
// # Events
//
// An [Event] is a plain struct passed by value; its [Kind] says which fields
// are set. One operation reports, in this order:
//
//   - OpStart, to [Observer.Start], whose returned context becomes the
//     operation's (an Observer can carry a trace span in it);
//   - then what happens, as it happens: Conflict, Retry or BudgetRefused,
//     Ambiguous followed by Settled, LeaseHeld, LeaseAcquired,
//     LeaseRenewed or LeaseRenewFailed, LeaseReleased or LeaseLost,
//     ClockSync;
//   - OpEnd, with the [Outcome] and the error the call returns.
//
// Every event of an operation carries its context, including the events of
// retry.Do and store.ServerClock, which do not know which operation they run in
// and leave Op, Database, Collection and ID empty: an Observer that needs
// them there keeps them in the context its Start returns (the OpenTelemetry
// adapter does). A lease's end, LeaseReleased or LeaseLost, comes with the
// lease's own context (the one of the call that acquired it, Do's for Do),
// whichever call or timer ended it: a lease that ends on its own, when its
// local deadline passes, reports it from a timer's goroutine.
//
// Modify calls on one document in one process are combined (see the
// versioned package): the call at the head of the line reads once, runs
// each queued call's fn and writes once for all of them. Each call still
// reports its own OpStart and OpEnd, on its own goroutine, with its own
// Outcome, Err and Attempt (the attempts it took part in). What happens in
// between is reported, in each call's own context, from the goroutine of
// the call leading the write: a Conflict, then a Retry (or BudgetRefused),
// for each attempt of the call that failed on a conflict, whichever other
// calls shared the write (Expected is the version the shared write was made
// against); and Ambiguous and Settled for a shared write whose reply was
// lost, to each call whose change it carried.
//
// # Guarantees
//
//   - No Observer, no cost: every place that reports an event checks for a
//     nil Observer before it builds anything, so a repository, manager or
//     policy without one allocates exactly what it did without this package
//     (make bench compares each operation with the raw driver in the same
//     run, with and without observers).
//   - The slog Observer allocates nothing for an event below the logger's
//     level, and never changes the context; at Info, an operation that goes
//     well logs nothing.
//   - Events are delivered synchronously, on the goroutine of the
//     operation, in the order above; OpStart and OpEnd pair up for every
//     call that passed its argument checks. A call refused before anything
//     is sent (bad input, a nil or ended context) reports nothing.
//   - An Observer sees the operation's own values (ID, Err): it must not
//     change them, and must be safe for concurrent use.
//
// # Errors
//
// This package returns no errors. An Observer cannot fail an operation or
// change its result; a panic in an Observer is a panic in the operation, so
// an Observer must not panic.
package observe

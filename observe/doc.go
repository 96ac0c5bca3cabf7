// Package observe is the one event surface of mongocas: what the versioned,
// lease, deferred, idempotency and retry packages (and store's server clock)
// tell an operator about the work they do. Give an [Observer] to a
// repository, a lease manager, a queue or a key set, and it sees each
// operation start and end, each conflict, retry, lost reply and its
// settlement, each lease's life, each job's life, and each idempotent request:
//
//	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
//	repo, err := versioned.New[Account](coll, &versioned.Options{Observer: observe.Slog(logger)})
//	leases, err := lease.New(users, &lease.Options{TTL: 30 * time.Second, Observer: observe.Slog(logger)})
//
// Three Observers come with it: [Slog] logs through a *slog.Logger, quiet at
// Info in normal operation; [Counters] counts events in memory; [Join] sends
// each event to several. The OpenTelemetry adapter (spans and metrics) is the
// module github.com/mongocas/mongocas/otelmongocas, so that this module
// depends on the driver only.
//
// The field is named Observer everywhere (Options, retry.Policy,
// store.ServerClockOptions). A repository, manager, queue or key set passes
// its Observer on to its retry policy (when that has none) and to the lease
// managers and server clock it makes, so one field sees everything.
//
// # Events
//
// An [Event] is a plain struct passed by value; its [Kind] says which fields
// are set. One operation reports, in this order:
//
//   - OpStart, to [Observer.Start], whose returned context becomes the
//     operation's (an Observer can carry a trace span in it);
//   - then what happens, as it happens: Conflict, Retry or BudgetRefused,
//     Ambiguous followed by Settled, the lease events, ClockSync;
//   - OpEnd, with the [Outcome] and the error the call returns.
//
// A queue's job events and a key set's request events have no OpStart and
// OpEnd: each says what became of a job or a request, reported by the
// goroutine that wrote it after the write. The events of one job come from
// different goroutines (the caller of Enqueue or Requeue, a worker), so
// they can arrive out of order: a worker may report a job claimed before
// the Enqueue that wrote it reports it enqueued. Order a job's events by
// what they say (its Attempt, the job's record), not by arrival.
//
// Every event of an operation carries its context, including those of
// retry.Do and store.ServerClock, which leave Op, Database, Collection and
// ID empty. A lease's end (LeaseReleased, LeaseLost) comes with the context
// of the call that acquired it, from a timer's goroutine when the lease ends
// on its own. Modify calls combined into one write (see the versioned
// package) each report their own OpStart and OpEnd; the events of the
// shared write reach each call, in its own context, from the goroutine of
// the call leading it.
//
// # Guarantees
//
//   - No Observer, no cost: every place that reports an event checks for a
//     nil Observer before it builds anything.
//   - The slog Observer allocates nothing for an event below the logger's
//     level, and never changes the context; at Info, an operation that goes
//     well logs nothing.
//   - Events are delivered synchronously, on the goroutine of the
//     operation, in the order above; OpStart and OpEnd pair up for every
//     call that passed its argument checks. A call refused before anything
//     is sent (bad input, a nil or ended context) reports nothing.
//
// # Errors
//
// This package returns no errors. An Observer cannot fail an operation or
// change its result; a panic in an Observer is a panic in the operation, so
// an Observer must not panic.
package observe

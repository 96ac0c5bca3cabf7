// Package otelmongocas reports what mongocas does to OpenTelemetry: a span
// per operation, with the database semantic conventions, and metrics of
// conflicts, retries, ambiguous writes, leases, deferred jobs and
// idempotent requests. It is an [observe.Observer]; give it to the
// repositories, lease managers, queues and Keys to watch:
//
//	obs, err := otelmongocas.New(nil) // the global TracerProvider and MeterProvider
//	...
//	repo, err := versioned.New[Account](coll, &versioned.Options{Observer: obs})
//	leases, err := lease.New(users, &lease.Options{TTL: 30 * time.Second, Observer: obs})
//	q, err := deferred.New(db.Collection("jobs"), &deferred.Options{Observer: obs})
//	reg, err := obs.ObserveQueue(q) // the mongocas.queue.depth gauge
//
// To log as well, join it with the slog Observer:
// observe.Join(obs, observe.Slog(logger)).
//
// A runnable example, with the SDK's in-memory span exporter and a server,
// is ExampleNew in the repository's tests/otelmongocas (this module links
// neither); `go test ./tests/otelmongocas -run Example` runs it.
//
// This package is a module of its own, github.com/mongocas/mongocas/otelmongocas,
// so that the library module depends on the driver only; this one
// adds go.opentelemetry.io/otel, its metric and trace APIs, and nothing else
// beyond the library's own dependencies (the SDK is the application's
// choice).
//
// # Spans
//
// Each operation (versioned: insert, get, update, delete, modify, guarded;
// lease: acquire, try_acquire, do, renew, release) is one span of kind
// client, a child of the span in the caller's context, named "<operation>
// <collection>" ("modify accounts"), with db.system.name "mongodb",
// db.namespace (the database), db.collection.name and db.operation.name (the
// operation). The operation runs in the span's context, so the driver's
// own spans, if it is instrumented, are its children, and a lease.Do span is
// the parent of its release and renewals and of the work done under the
// lease. At its end the span gets mongocas.outcome, error.type (the outcome,
// unless "ok"), mongocas.attempts for Modify, and, for an outcome that
// failed (observe.Outcome.Failed: not a conflict, a missing document, a
// failed condition, a duplicate, a held lease or bad input), the error and
// an error status. Conflicts, retries, refused retries, ambiguous writes and
// their settlement, clock syncs and the lease events are span events.
//
// # Metrics
//
// Their attributes are db.system.name, db.namespace, db.collection.name and
// db.operation.name of the operation (for a retry, the operation it retried
// in), plus those listed:
//
//   - db.client.operation.duration (s, histogram), with error.type when the
//     outcome is not "ok": the semantic-convention metric.
//   - mongocas.conflicts ({conflict}): version conflicts.
//   - mongocas.retries ({retry}): retries, for any cause.
//   - mongocas.retry.budget_refusals ({retry}): retries the budget refused.
//   - mongocas.modify.attempts ({attempt}, histogram): attempts per Modify.
//   - mongocas.writes.ambiguous ({write}), with mongocas.settlement:
//     ambiguous writes by how they were settled.
//   - mongocas.unknown_outcomes ({operation}): operations that returned
//     store.ErrUnknownOutcome.
//   - mongocas.lease.wait.duration (s, histogram): from the call to the
//     claim that got the lease.
//   - mongocas.lease.hold.duration (s, histogram), with mongocas.lease.end
//     ("released" or "lost"): from the claim to the release or the loss.
//   - mongocas.lease.lost ({lease}), with mongocas.lease.reason: leases lost
//     by their holder.
//
// The events of deferred queues and idempotency keys carry their own
// collection (the jobs', the records'), and db.operation.name the call
// that reported them ("enqueue", "requeue", "cancel", "run" for a queue's
// workers, the failed step of a queue error; "do"):
//
//   - mongocas.jobs ({job}), with mongocas.event ("job.enqueued",
//     "job.claimed", "job.completed", "job.failed", "job.dead",
//     "job.snoozed", "job.requeued", "job.cancelled"), mongocas.job.name
//     (the handler) and, where an attempt ended, mongocas.outcome.
//   - mongocas.job.age (s, histogram), with mongocas.job.name: a job's age
//     when a worker claims it, the time since it was enqueued.
//   - mongocas.job.duration (s, histogram), with the attributes of
//     mongocas.jobs: how long a handler ran, per attempt.
//   - mongocas.queue.errors ({error}), with mongocas.event ("queue.error",
//     "queue.key_skipped"): what the workers could not return to anyone.
//   - mongocas.queue.depth ({job}, gauge), with mongocas.job.state
//     ("available", "retryable", "running", "dead"): read from
//     deferred.Queue.Counts at each collection, for the queues registered
//     with [Observer.ObserveQueue].
//   - mongocas.idempotency.requests ({request}), with mongocas.event
//     ("idempotency.completed", "idempotency.replayed",
//     "idempotency.in_progress", "idempotency.mismatch").
//
// The events of a move.Mover carry the moved documents' collection and
// db.operation.name "move" (the debit) or "relay" (the settlement):
//
//   - mongocas.moves ({move}), with mongocas.event ("move.debited",
//     "move.done", "move.returned"). Debits minus settlements is about
//     the number of moves in flight (a process that dies just after a
//     write reports nothing; mongocas moves counts them exactly).
//   - mongocas.move.duration (s, histogram), with mongocas.event
//     ("move.done", "move.returned"): how long a move's value was in
//     flight, from its debit to its settlement.
//
// Document ids, move ids and lease names are on no span or metric: they are often
// personal data, and they would make a metric's cardinality unbounded.
//
// # Guarantees
//
//   - Every span an operation starts ends with its OpEnd, on the
//     operation's goroutine.
//   - The Observer is safe for concurrent use and never fails an operation.
//
// # Errors
//
// [New] fails only if the MeterProvider refuses to make an instrument (an
// invalid name or option: a bug here, not a condition to handle).
package otelmongocas

package observe

import (
	"context"
	"strconv"
	"time"
)

// Observer receives the events of the packages that take one (their
// Observer fields). Its methods run on the goroutine of the operation,
// synchronously: keep them short, and never block in them. It must be safe
// for concurrent use.
//
// The Event is passed by value: an Observer may keep it. Its ID and Err are
// the operation's own values; do not change what they point to.
type Observer interface {
	// Start is called when an operation begins (e.Kind is OpStart). The
	// context it returns becomes the operation's, for its I/O and its later
	// events, so it can carry a trace span. Return ctx to add nothing.
	Start(ctx context.Context, e Event) context.Context

	// Observe is called for every other event, with the operation's
	// context (the one Start returned) when the event belongs to an
	// operation.
	Observe(ctx context.Context, e Event)
}

// Kind says what an Event reports. Each kind documents the Event fields it
// sets; the others are zero.
type Kind uint8

// The kinds of events. Op, Database, Collection and ID are set on the
// events of versioned, lease, deferred, idempotency and move, and empty on
// those of retry.Do and store.ServerClock (which carry the operation's
// context).
const (
	// OpStart: an operation begins. Sent to Observer.Start.
	OpStart Kind = iota + 1

	// OpEnd: the operation ends. Outcome, Err (nil on success), Elapsed;
	// Attempt is the number of attempts of versioned Modify, 0 for the
	// other operations.
	OpEnd

	// Conflict: a write expected a version and found another. Expected and
	// Current are the versions; Current is -1 when the repository did not
	// read it.
	Conflict

	// Retry: an attempt failed with a retryable error and another one
	// follows after Delay. Attempt is the attempt that failed, Err its error.
	Retry

	// BudgetRefused: as Retry, but the retry.Budget had no token for another
	// attempt, so the operation stops.
	BudgetRefused

	// Ambiguous: a write failed in a way that leaves its outcome unknown;
	// Err is that failure. A Settled event follows.
	Ambiguous

	// Settled: what re-reading found about the ambiguous write reported
	// before. Settlement says it; Err is set for SettledUnknown.
	Settled

	// LeaseAcquired: a lease was claimed. Epoch, Owner; Wait is the time
	// from the call to the claim.
	LeaseAcquired

	// LeaseRenewed: a renewal was applied. Epoch, Owner, TimeLeft (until
	// the holder's new local deadline).
	LeaseRenewed

	// LeaseRenewFailed: a renewal failed without losing the lease: it stays
	// held until its deadline. Epoch, Owner, Err.
	LeaseRenewFailed

	// LeaseLost: the holder lost its lease. Epoch, Owner, Reason, Holder (if
	// read), Held, Err (the *lease.LostError).
	LeaseLost

	// LeaseReleased: the holder released its lease. Epoch, Owner, Held.
	LeaseReleased

	// LeaseHeld: a claim found the lease held by another owner. Holder, Epoch
	// and TimeLeft (the holder's).
	LeaseHeld

	// ClockSync: a store.ServerClock took new readings. Bound, RTT.
	ClockSync

	// The events of a deferred.Queue: Database and Collection name the jobs
	// collection; ID, Key and Name the job; Op is "enqueue", "requeue",
	// "cancel", or "run" for the workers. A claimed attempt ends with
	// JobCompleted, JobFailed, JobDead or JobSnoozed, unless Run stopped or
	// the worker lost its claim on the key (a QueueError).

	// JobEnqueued: Enqueue stored a job (reported when it returns the id).
	JobEnqueued

	// JobClaimed: a worker claimed a job for an attempt. Attempt is the
	// attempt's number, from 1; Age the time since the job was enqueued.
	JobClaimed

	// JobCompleted: the job's handler returned nil and the job is
	// completed. Attempt, Outcome (OK), Elapsed (the handler's run).
	JobCompleted

	// JobFailed: an attempt failed and the job runs again after Delay.
	// Attempt, Err (the handler's), Outcome (how it failed), Elapsed.
	JobFailed

	// JobDead: the job failed for good (its last attempt, a permanent
	// error, bad input, or a worker lost during its last attempt). Attempt,
	// Err, Outcome, Elapsed (0 when no handler ran).
	JobDead

	// JobSnoozed: the handler snoozed the job (deferred.Snooze); it runs
	// again after Delay, its attempt not counted. Attempt, Elapsed.
	JobSnoozed

	// JobRequeued: Requeue put a dead or cancelled job back in the queue.
	JobRequeued

	// JobCancelled: Cancel took a job out of the queue.
	JobCancelled

	// QueueKeySkipped: a worker left a key to other processes. Reason
	// ("no_handler": this process has no handler for the key's head job),
	// Key, ID and Name of that job.
	QueueKeySkipped

	// QueueError: something a worker (or Cancel's clean-up) could not
	// return to anyone failed: Op names the step ("sweep", "claim_key",
	// "put_back", ...; "run" when the worker lost its claim on the key: with
	// the job's ID when it lost it while the job ran, with the Key alone
	// between jobs), Key or ID what it was about, Err.
	QueueError

	// The events of idempotency.Keys: Op is "do"; Database and Collection
	// name the records' collection; ID is the idempotency key (without its
	// scope).

	// KeyCompleted: a request ran and its result was stored. Attempt is
	// the run of the key (1 for the first claim that ran it), Epoch the
	// claim's.
	KeyCompleted

	// KeyReplayed: a request got an earlier one's result; nothing ran.
	KeyReplayed

	// KeyInProgress: another request holds the key's claim; nothing ran.
	// Holder, Epoch (the holder's), TimeLeft.
	KeyInProgress

	// KeyMismatch: the key was first used with another request; nothing ran.
	KeyMismatch

	// The events of a move.Mover: Op is "move" for Move's debit, "all" for
	// MoveAll's debits and the returns MoveAll makes itself after a step
	// failed, "relay" for the relay's settlements; Database and Collection
	// name the documents' collection; ID is the move's id (a
	// bson.ObjectID); From and To its ends, Amount its value. Each is reported once per move by the process
	// whose write made it happen (none when that process dies right after
	// the write).

	// MoveDebited: a debit (Move's or MoveAll's) landed: Amount left From
	// and is in flight.
	MoveDebited

	// MoveDone: the relay settled the move with To credited. Age is the
	// time since the debit (by the two processes' clocks).
	MoveDone

	// MoveReturned: the credit could not apply (To missing or refusing
	// it); the relay gave Amount back to From. Age as for MoveDone.
	MoveReturned

	kindEnd // one past the last kind
)

var kindNames = [kindEnd]string{
	OpStart:          "op.start",
	OpEnd:            "op.end",
	Conflict:         "conflict",
	Retry:            "retry",
	BudgetRefused:    "retry.budget_refused",
	Ambiguous:        "write.ambiguous",
	Settled:          "write.settled",
	LeaseAcquired:    "lease.acquired",
	LeaseRenewed:     "lease.renewed",
	LeaseRenewFailed: "lease.renew_failed",
	LeaseLost:        "lease.lost",
	LeaseReleased:    "lease.released",
	LeaseHeld:        "lease.held",
	ClockSync:        "clock.sync",
	JobEnqueued:      "job.enqueued",
	JobClaimed:       "job.claimed",
	JobCompleted:     "job.completed",
	JobFailed:        "job.failed",
	JobDead:          "job.dead",
	JobSnoozed:       "job.snoozed",
	JobRequeued:      "job.requeued",
	JobCancelled:     "job.cancelled",
	QueueKeySkipped:  "queue.key_skipped",
	QueueError:       "queue.error",
	KeyCompleted:     "idempotency.completed",
	KeyReplayed:      "idempotency.replayed",
	KeyInProgress:    "idempotency.in_progress",
	KeyMismatch:      "idempotency.mismatch",
	MoveDebited:      "move.debited",
	MoveDone:         "move.done",
	MoveReturned:     "move.returned",
}

// String returns the kind's name, such as "conflict" or "lease.lost".
func (k Kind) String() string {
	if k > 0 && k < kindEnd {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Settlement says what re-reading found about a write whose outcome was
// ambiguous.
type Settlement uint8

const (
	// SettledLanded means the write was applied; only its reply was lost.
	SettledLanded Settlement = iota + 1
	// SettledResent means the write had not been applied, was sent again, and
	// the copy sent again was applied (at most one copy ever applies).
	SettledResent
	// SettledNotLanded means the write was not applied, as far as a majority of
	// the replica set shows.
	SettledNotLanded
	// SettledUnknown means re-reading could not tell: the operation returns an
	// error matching store.ErrUnknownOutcome, or keeps a lease claim pending.
	SettledUnknown
)

var settlementNames = [...]string{SettledLanded: "landed", SettledResent: "resent", SettledNotLanded: "not_landed", SettledUnknown: "unknown"}

// String returns "landed", "resent", "not_landed" or "unknown".
func (s Settlement) String() string {
	if s >= SettledLanded && s <= SettledUnknown {
		return settlementNames[s]
	}
	return "Settlement(" + strconv.Itoa(int(s)) + ")"
}

// Outcome is how an operation ended: a short, fixed name, fit for a metric
// attribute or a log field.
type Outcome string

// The outcomes. Each package maps its errors onto them through errors.Is.
const (
	// OK: the operation succeeded.
	OK Outcome = "ok"
	// OutcomeConflict: a version conflict (versioned.ErrConflict), also
	// when Modify's retries ran out on conflicts.
	OutcomeConflict Outcome = "conflict"
	// OutcomeNotFound: no such document (versioned.ErrNotFound,
	// lease.ErrNotFound).
	OutcomeNotFound Outcome = "not_found"
	// OutcomeGuardFailed: a condition of the write did not hold
	// (versioned.ErrGuardFailed).
	OutcomeGuardFailed Outcome = "guard_failed"
	// OutcomeDuplicate: a duplicate key (versioned.ErrDuplicate).
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeHeld: another owner holds the lease (lease.ErrHeld).
	OutcomeHeld Outcome = "held"
	// OutcomeLost: the lease was lost (lease.ErrLost), or was already
	// released (lease.ErrReleased).
	OutcomeLost Outcome = "lost"
	// OutcomeInvalid: bad input, nothing sent (store.ErrInvalid).
	OutcomeInvalid Outcome = "invalid"
	// OutcomeUnknown: a write's outcome could not be settled
	// (store.ErrUnknownOutcome).
	OutcomeUnknown Outcome = "unknown_outcome"
	// OutcomeBudget: the retry budget refused a retry
	// (retry.ErrBudgetExhausted).
	OutcomeBudget Outcome = "budget_exhausted"
	// OutcomeExhausted: the retries ran out on a transient error
	// (retry.ErrExhausted).
	OutcomeExhausted Outcome = "retries_exhausted"
	// OutcomeCanceled: the caller's context ended (context.Canceled or
	// context.DeadlineExceeded).
	OutcomeCanceled Outcome = "canceled"
	// OutcomeAborted: the caller's own function returned an error, which
	// the call returns: the caller's answer, not the library's failure.
	OutcomeAborted Outcome = "aborted"
	// OutcomeError: any other error (network, server, decoding, the error
	// of the caller's function).
	OutcomeError Outcome = "error"
)

// Failed reports whether the outcome is a failure to do what was asked, as
// opposed to success or an answer (a conflict, a missing document, a failed
// condition, a duplicate, a held lease, bad input, the caller's own
// function's error). Slog logs failures at Info; otelmongocas marks only
// failures as span errors.
func (o Outcome) Failed() bool {
	switch o {
	case OK, OutcomeConflict, OutcomeNotFound, OutcomeGuardFailed, OutcomeDuplicate, OutcomeHeld, OutcomeInvalid, OutcomeAborted:
		return false
	default:
		return true
	}
}

// Event is one thing that happened in an operation. Kind says which fields
// are set (see each Kind); the others are zero.
type Event struct {
	// Kind says what happened.
	Kind Kind

	// Op names the operation: "insert", "get", "update", "delete",
	// "modify", "guarded" (versioned); "acquire" (any claim), "try_acquire",
	// "do", "renew", "release" (lease; LeaseLost has none); "enqueue",
	// "requeue", "cancel", "run" or a QueueError's step (deferred); "do"
	// (idempotency); "move", "relay" (move).
	Op string
	// Database and Collection name the operation's collection.
	Database, Collection string
	// ID is the document's id or a named lease's name, as the caller gave
	// it; a job's id (deferred); the idempotency key; a move's id.
	ID any
	// Key and Name (deferred) are the job's key as text (extended JSON, cut
	// to 64 bytes) and its handler.
	Key, Name string
	// From and To (move events) are the move's ends as text, as Key is;
	// Amount is the value it moves.
	From, To string
	Amount   int64

	// Outcome (OpEnd and the job events) says how the operation, or the
	// job's attempt, ended.
	Outcome Outcome
	// Err is the event's error: the operation's, the cause, or the failure
	// (see each Kind).
	Err error
	// Elapsed is how long the operation (OpEnd) or handler (job events) took.
	Elapsed time.Duration
	// Attempt is the number of the attempt that failed (Retry,
	// BudgetRefused), the attempts made (OpEnd), a job's attempt, or the run
	// of an idempotency key (KeyCompleted).
	Attempt int
	// Delay is the wait before the next attempt (Retry: 0 for a retry made
	// at once; JobFailed, JobSnoozed).
	Delay time.Duration
	// Age is the time from the job's enqueue to its claim (JobClaimed), or
	// from a move's debit to its settlement (MoveDone, MoveReturned).
	Age time.Duration

	// Expected and Current (Conflict) are the version the write expected
	// and the one found, -1 if not read.
	Expected, Current int64

	// Settlement (Settled) says what became of an ambiguous write.
	Settlement Settlement

	// Epoch is the lease's fencing token (the holder's for LeaseHeld and
	// KeyInProgress; the storing claim's for KeyCompleted).
	Epoch int64
	// Owner is this Manager's owner string (lease events).
	Owner string
	// Holder (LeaseHeld, LeaseLost, KeyInProgress) is the owner the lease
	// record names, when it was read.
	Holder string
	// Reason says why a lease was lost (LeaseLost: "expired", "taken_over",
	// "cleared", "unread") or a key skipped (QueueKeySkipped: "no_handler").
	Reason string
	// Wait (LeaseAcquired) is how long the claim took, waiting included.
	Wait time.Duration
	// Held (LeaseReleased, LeaseLost) is how long the lease was held.
	Held time.Duration
	// TimeLeft is the holder's time left: another owner's (LeaseHeld,
	// KeyInProgress), this owner's after a renewal (LeaseRenewed).
	TimeLeft time.Duration

	// Bound and RTT (ClockSync) are those of the server-clock reading kept.
	Bound, RTT time.Duration
}

// Join returns an Observer that passes every event to each non-nil one of
// obs in turn; each Start receives the context the previous one returned.
// Join returns nil when every Observer is nil, and the Observer itself when
// only one is not.
func Join(obs ...Observer) Observer {
	var list []Observer
	for _, o := range obs {
		switch o := o.(type) {
		case nil:
		case joined:
			list = append(list, o...)
		default:
			list = append(list, o)
		}
	}
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	return joined(list)
}

type joined []Observer

func (j joined) Start(ctx context.Context, e Event) context.Context {
	for _, o := range j {
		ctx = o.Start(ctx, e) //nolint:fatcontext // each Start wraps the previous one's context: the chain is the point
	}
	return ctx
}

func (j joined) Observe(ctx context.Context, e Event) {
	for _, o := range j {
		o.Observe(ctx, e)
	}
}

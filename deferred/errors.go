package deferred

import (
	"errors"
	"fmt"
	"reflect"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/store"
)

// Sentinel errors. Match them with errors.Is; the typed errors below carry
// the facts and match their sentinel.
var (
	// ErrInvalid is matched by every error that refuses a caller's input
	// before anything is stored. It is [store.ErrInvalid].
	ErrInvalid = store.ErrInvalid
	// ErrInvalidID is matched by an error that refuses a key (nil, zero,
	// operator-shaped), with ErrInvalid. It is [store.ErrInvalidID].
	ErrInvalidID = store.ErrInvalidID
	// ErrUnknownOutcome is matched by an error whose write may or may not
	// have taken effect. It is [store.ErrUnknownOutcome].
	ErrUnknownOutcome = store.ErrUnknownOutcome
	// ErrNotFound is matched by *NotFoundError: no job has the id.
	ErrNotFound = errors.New("deferred: job not found")
	// ErrState is matched by *StateError: wrong state for the operation.
	ErrState = errors.New("deferred: job in the wrong state")
	// ErrOneByOne is what a run function (RegisterRun) returns for the
	// jobs it did not take: they run one at a time through the handler.
	// GuardedRun returns it when the target carries the stamp of one of
	// the run's jobs already.
	ErrOneByOne = errors.New("deferred: run the jobs one at a time")
)

// InvalidError reports bad input refused before anything was stored: the
// operation ("new", "register", "enqueue", ...), what was refused ("name",
// "key", "args", an Options field), why, and the underlying error, if any.
// It matches ErrInvalid (and ErrInvalidID for a key) and unwraps to Err.
type InvalidError struct {
	Op, Field, Reason string
	Err               error
}

// Error returns a message with the operation, the field and the reason.
func (e *InvalidError) Error() string {
	msg := fmt.Sprintf("deferred: %s: invalid %s: %s", e.Op, e.Field, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrInvalid, or ErrInvalidID for a refused key.
func (e *InvalidError) Is(target error) bool {
	return target == ErrInvalid || (target == ErrInvalidID && e.Field == "key")
}

// Unwrap returns the underlying error.
func (e *InvalidError) Unwrap() error { return e.Err }

// NotFoundError reports that no job has the id. It matches ErrNotFound.
type NotFoundError struct {
	ID bson.ObjectID
}

// Error returns a message with the id.
func (e *NotFoundError) Error() string {
	return fmt.Sprintf("deferred: job %s not found", e.ID.Hex())
}

// Is reports whether target is ErrNotFound.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// StateError reports that a job's state does not allow the operation
// ("requeue" or "cancel"); MayHaveApplied is true when Requeue refused a
// job whose write may have landed (Job.MayHaveApplied). It matches
// ErrState.
type StateError struct {
	Op             string
	ID             bson.ObjectID
	State          State
	MayHaveApplied bool
}

// Error returns a message with the operation, the id and the state.
func (e *StateError) Error() string {
	if e.MayHaveApplied {
		return fmt.Sprintf("deferred: %s job %s: the job is %s and may have applied its change (an attempt's write landed, or its outcome is unknown): running it again could apply it twice; check its target documents, then cancel it or enqueue what is missing as a new job", e.Op, e.ID.Hex(), e.State)
	}
	return fmt.Sprintf("deferred: %s job %s: the job is %s", e.Op, e.ID.Hex(), e.State)
}

// Is reports whether target is ErrState.
func (e *StateError) Is(target error) bool { return target == ErrState }

// UnknownOutcomeError reports a write whose outcome could not be settled.
// It is [store.UnknownOutcomeError] (Pkg "deferred"); it matches
// ErrUnknownOutcome and unwraps to the write's error.
type UnknownOutcomeError = store.UnknownOutcomeError

// PanicError is the error an attempt records when its handler panicked:
// the value, and the goroutine's stack cut to a few kilobytes. The worker
// recovers, fails the attempt, and lives on.
type PanicError struct {
	Value any
	Stack string
}

// Error returns a message with the panic value.
func (e *PanicError) Error() string { return fmt.Sprintf("deferred: handler panicked: %v", e.Value) }

// snoozeError is what Snooze returns.
type snoozeError struct{ d time.Duration }

func (e *snoozeError) Error() string { return fmt.Sprintf("deferred: snooze for %v", e.d) }

// Snooze returns an error that a handler returns to run its job again after
// d without counting the attempt: the job goes back to the available state,
// and its key waits (the jobs enqueued after it on the key wait too). A
// negative d counts as 0.
func Snooze(d time.Duration) error { return &snoozeError{d: max(d, 0)} }

// invalid is a shorthand for an *InvalidError.
func invalid(op, field, reason string, err error) error {
	return &InvalidError{Op: op, Field: field, Reason: reason, Err: err}
}

// argsError is the error of a job whose stored argument does not decode
// into the type of its handler's argument: bad input, which fails every
// attempt alike, so the job is dead at once (an *InvalidError, Op "run",
// Field "args", naming the handler and the type).
func argsError(job *Job, typ reflect.Type, err error) error {
	return invalid("run", "args", fmt.Sprintf("job %s of %q: the stored argument does not decode into %v", job.ID.Hex(), job.Name, typ), err)
}

// keyText formats a key for a message, cut short: keys come from requests.
func keyText(k bson.RawValue) string { return shorten(k.String()) }

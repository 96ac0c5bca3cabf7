package store

import "fmt"

// UnknownOutcomeError reports a write whose reply was lost (see IsAmbiguous)
// and whose outcome re-reading could not settle: it may or may not have been
// applied; never retry it blindly. Each package names it as its own (an
// alias). It matches ErrUnknownOutcome and unwraps to the write's error.
type UnknownOutcomeError struct {
	// Pkg is the package whose write it was ("versioned", "lease",
	// "deferred", "idempotency"): the message's prefix.
	Pkg string
	// Op is the operation: "modify", "acquire", "enqueue", ...
	Op string
	// ID is what the write changed: a document's id, a named lease's name,
	// a job's id (a bson.ObjectID), an idempotency key.
	ID any
	// Subject, if set, names ID in the message instead of ID itself
	// (`job 6b0e...`, `key "k"`).
	Subject string
	// Reason says why re-reading could not settle it.
	Reason string
	// Err is the error of the write, joined with those of the re-reads
	// and resends that failed.
	Err error

	// WriteID, Base and Current are set for versioned's writes: the
	// write's id, the version it was made against, and the version last
	// read (-1 if no read succeeded).
	WriteID string
	Base    int64
	Current int64
}

// Error returns a message with the package, the operation, what it
// changed, the reason and the cause.
func (e *UnknownOutcomeError) Error() string {
	what := e.Subject
	if what == "" {
		what = fmt.Sprint(e.ID)
	}
	msg := fmt.Sprintf("%s: %s %s: outcome unknown", e.Pkg, e.Op, what)
	if e.WriteID != "" {
		msg = fmt.Sprintf("%s: %s %s: outcome of write %s (base version %d, current %d) unknown", e.Pkg, e.Op, what, e.WriteID, e.Base, e.Current)
	}
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg + ": " + fmt.Sprint(e.Err)
}

// Is reports whether target is ErrUnknownOutcome.
func (e *UnknownOutcomeError) Is(target error) bool { return target == ErrUnknownOutcome }

// Unwrap returns the write's error.
func (e *UnknownOutcomeError) Unwrap() error { return e.Err }

// Retryable reports false: a blind retry could apply the write twice.
func (e *UnknownOutcomeError) Retryable() bool { return false }

package versioned

import (
	"errors"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/store"
)

// Sentinel errors. Match them with errors.Is; the typed errors below carry the
// facts (id, versions, write id) and match their sentinel.
var (
	// ErrConflict is matched by *ConflictError: the document's version is
	// no longer the one the write expected.
	ErrConflict = errors.New("versioned: version conflict")

	// ErrNotFound is matched by *NotFoundError: no document has the id.
	ErrNotFound = errors.New("versioned: document not found")

	// ErrGuardFailed is matched by *GuardError: the document exists (at the
	// expected version, for writes that expect one) but does not satisfy
	// the write's condition or a Where filter.
	ErrGuardFailed = errors.New("versioned: guard condition not met")

	// ErrDuplicate is matched by *DuplicateError: Insert of an id that
	// exists already, or any write that would duplicate a unique index key.
	ErrDuplicate = errors.New("versioned: duplicate key")

	// ErrInvalid is matched by *InvalidError and *VersionTypeError: bad
	// input, detected before anything was written. It is [store.ErrInvalid]
	// (the same value in every mongocas package).
	ErrInvalid = store.ErrInvalid

	// ErrInvalidID is matched by an *InvalidError that refuses an id: nil,
	// zero, of the wrong type, or whose encoding could act as a query
	// operator ($-keys, regular expressions, code). It also matches
	// ErrInvalid. It is [store.ErrInvalidID].
	ErrInvalidID = store.ErrInvalidID

	// ErrUnknownOutcome is matched by *UnknownOutcomeError: a write failed
	// in a way that leaves open whether the server applied it, and re-reading
	// the document could not settle it. The write was not retried. It is
	// [store.ErrUnknownOutcome].
	ErrUnknownOutcome = store.ErrUnknownOutcome
)

// ConflictError reports that a write expected the document at one version
// and found it at another: someone else wrote it since it was read. It
// matches ErrConflict, and its Retryable method reports true, so retry.Do
// retries it.
type ConflictError struct {
	// Op is the operation: "update", "delete", "modify" or "guarded".
	Op string
	// ID is the document's id.
	ID any
	// Expected is the version the write expected.
	Expected int64
	// Current is the version the document had when re-read, or -1 if it
	// was not re-read: Modify does not re-read after each conflict (its next
	// attempt reads anyway), so the errors its OnRetry hook sees carry -1;
	// the error it returns carries the version.
	Current int64
}

// Error returns a message with the id and both versions.
func (e *ConflictError) Error() string {
	if e.Current < 0 {
		return fmt.Sprintf("versioned: %s %v: version conflict: document is no longer at version %d", e.Op, e.ID, e.Expected)
	}
	return fmt.Sprintf("versioned: %s %v: version conflict: expected version %d, document is at version %d", e.Op, e.ID, e.Expected, e.Current)
}

// Is reports whether target is ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Retryable reports true: a conflict passes once the write is recomputed
// from the document's current state.
func (e *ConflictError) Retryable() bool { return true }

// NotFoundError reports that no document has the id. It matches ErrNotFound.
type NotFoundError struct {
	// Op is the operation.
	Op string
	// ID is the id that was looked for.
	ID any
}

// Error returns a message with the id.
func (e *NotFoundError) Error() string {
	return fmt.Sprintf("versioned: %s %v: document not found", e.Op, e.ID)
}

// Is reports whether target is ErrNotFound.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// GuardError reports that the document exists, at the expected version for
// writes that expect one, but did not satisfy the write's condition (the
// cond of Guarded) or one of its Where filters when the write was applied.
// It matches ErrGuardFailed and, when the failing filter was given with
// WhereErr, that filter's error too.
type GuardError struct {
	// Op is the operation.
	Op string
	// ID is the document's id.
	ID any
	// Version is the document's version when re-read.
	Version int64
	// Err is the error given to WhereErr for the filter found failing, or
	// nil when the failing condition has no error of its own (Guarded's
	// cond, a Where filter) or when it could not be told which one failed.
	Err error
}

// Error returns a message with the id and version.
func (e *GuardError) Error() string {
	msg := fmt.Sprintf("versioned: %s %v: guard condition not met at version %d", e.Op, e.ID, e.Version)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrGuardFailed.
func (e *GuardError) Is(target error) bool { return target == ErrGuardFailed }

// Unwrap returns the WhereErr error, if any, so errors.Is and errors.As
// reach it.
func (e *GuardError) Unwrap() error { return e.Err }

// DuplicateError reports that a write would duplicate a unique key: Insert
// of an id that exists, or a value that a unique index holds already. It
// matches ErrDuplicate and unwraps to the driver's error.
type DuplicateError struct {
	// Op is the operation.
	Op string
	// ID is the document's id.
	ID any
	// Err is the driver's duplicate key error (nil when Insert learned the
	// id was taken by re-reading after a lost reply).
	Err error
}

// Error returns a message with the id.
func (e *DuplicateError) Error() string {
	msg := fmt.Sprintf("versioned: %s %v: duplicate key", e.Op, e.ID)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrDuplicate.
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// Unwrap returns the driver's error.
func (e *DuplicateError) Unwrap() error { return e.Err }

// InvalidError reports bad input detected before anything was sent: a nil
// document, a missing, zero or mistyped id, a field name MongoDB would read
// as an operator or a path, a document over 16 MiB, an update operator
// Guarded does not allow, a bad Options field, or a context that had
// already ended. It matches ErrInvalid and unwraps to the underlying error
// (the context's error, an encoding error), if any.
type InvalidError struct {
	// Op is the operation, or "new" for New.
	Op string
	// Field names the offending field or path, when there is one.
	Field string
	// Reason says what is wrong.
	Reason string
	// Err is the underlying error, if any.
	Err error
}

// Error returns a message with the operation, the field and the reason.
func (e *InvalidError) Error() string {
	if ide, ok := e.Err.(*store.IDError); ok && e.Reason == "" { //nolint:errorlint // only the direct wrap reads better unprefixed
		return "versioned: " + e.Op + ": " + ide.Error()
	}
	msg := "versioned: " + e.Op + ": invalid input"
	if e.Field != "" {
		msg += " at " + e.Field
	}
	msg += ": " + e.Reason
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrInvalid, or ErrInvalidID for an error
// about the id.
func (e *InvalidError) Is(target error) bool {
	return target == ErrInvalid || (target == ErrInvalidID && e.Field == "_id")
}

// Unwrap returns the underlying error.
func (e *InvalidError) Unwrap() error { return e.Err }

// VersionTypeError reports that a stored document's version field holds a
// value that is not an integer from 0 to math.MaxInt64-1 (a string, a
// fraction, a negative number, math.MaxInt64, after which no write could
// follow), or that its incarnation (MetaField's "inc") is not a non-zero
// integer (another protocol's, or one a tool rewrote inexactly): the
// repository will not guess what it means, and writes nothing to it. It
// matches ErrInvalid.
type VersionTypeError struct {
	// Op is the operation.
	Op string
	// ID is the document's id.
	ID any
	// Field is the version field's name, or the incarnation's path.
	Field string
	// Value is the stored value.
	Value bson.RawValue
}

// Error returns a message with the id, the field and the stored value.
func (e *VersionTypeError) Error() string {
	want := fmt.Sprintf("an integer from 0 to %d", int64(lastVersion))
	if strings.HasSuffix(e.Field, "."+metaInc) {
		want = "a non-zero integer"
	}
	return fmt.Sprintf("versioned: %s %v: invalid input: stored field %q holds %s %s, want %s", e.Op, e.ID, e.Field, e.Value.Type, e.Value, want)
}

// Is reports whether target is ErrInvalid.
func (e *VersionTypeError) Is(target error) bool { return target == ErrInvalid }

// UnknownOutcomeError reports a write whose reply was lost and whose
// outcome re-reading could not settle: it may or may not have been applied.
// It is [store.UnknownOutcomeError], the one such type of the library (its
// Pkg is "versioned"); it matches ErrUnknownOutcome and unwraps to the
// write's error. Here re-reading cannot tell when more than [WriteIDs]
// writes landed after it, the document was deleted (and perhaps inserted
// again) meanwhile, the re-read itself kept failing, or the write may still
// be in flight and the context ended or its condition stopped holding;
// WriteID, Base and Current carry the write's facts.
type UnknownOutcomeError = store.UnknownOutcomeError

// wrapErr prefixes a driver error with the operation and id, keeping it
// reachable through errors.Is and errors.As.
func wrapErr(op string, id any, err error) error {
	return fmt.Errorf("versioned: %s %v: %w", op, id, err)
}

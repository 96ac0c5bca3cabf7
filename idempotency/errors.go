package idempotency

import (
	"errors"
	"fmt"
	"time"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/store"
)

// Sentinel errors. Every error the package returns for a key matches at most
// one of ErrInProgress, ErrMismatch, ErrInvalid, ErrLost and
// ErrUnknownOutcome through errors.Is, except that an error of the caller's
// function is returned as it is. The typed errors below carry the facts.
var (
	// ErrInProgress is matched by the *InProgressError returned when another
	// request with the same key holds its claim and has not finished: the
	// caller's function did not run. HTTP: 409 Conflict with Retry-After.
	ErrInProgress = errors.New("a request with this key is in progress")

	// ErrMismatch is matched by the *MismatchError returned when a key is
	// reused with a request whose fingerprint differs from the first one's.
	// Nothing ran and nothing was written. HTTP: 422 Unprocessable Content.
	ErrMismatch = errors.New("key reused with a different request")

	// ErrInvalid is [store.ErrInvalid]: bad input (an Options field, a nil
	// context or function, a key, a checkpoint name), refused before anything
	// is sent. Nothing was written. HTTP: 400 Bad Request.
	ErrInvalid = store.ErrInvalid

	// ErrInvalidKey is matched by the *KeyError that refuses a key: empty,
	// longer than [MaxKeyLen] bytes, not printable ASCII, or holding a "$"
	// (shaped like a query operator). It matches ErrInvalid too.
	ErrInvalidKey = fmt.Errorf("invalid idempotency key: %w", store.ErrInvalid)

	// ErrLost is [lease.ErrLost]: the claim on the key ended (its TTL ran
	// out without a renewal, or a later claim took it over) before the
	// function's result or a checkpoint could be recorded under it. The
	// result was not stored; a retry runs the function again, from the last
	// checkpoint.
	ErrLost = lease.ErrLost

	// ErrUnknownOutcome is [store.ErrUnknownOutcome]: the key's record could
	// not be settled. A write of it failed ambiguously and re-reading it (for
	// up to Options.ResolveTimeout) could not tell whether it was applied
	// (*UnknownOutcomeError), or it was deleted between its open and its
	// claim each time Do opened it (*RecordGoneError: the function did not
	// run).
	ErrUnknownOutcome = store.ErrUnknownOutcome
)

// InProgressError reports that another request with the same key holds the
// key's claim: it is running, or it died and its claim has not expired yet.
// It matches ErrInProgress. A service answers 409 Conflict with TimeLeft as
// Retry-After.
type InProgressError struct {
	// Key is the idempotency key, as the caller gave it.
	Key string
	// Owner is the owner string of the claim's holder (lease.Options.Owner
	// of its Keys).
	Owner string
	// Epoch is the holder's claim epoch.
	Epoch int64
	// TimeLeft is the longest the claim can stay held without a renewal:
	// the holder may finish sooner, and its renewals extend it.
	TimeLeft time.Duration
}

// Error names the key, the holder and the time left.
func (e *InProgressError) Error() string {
	return fmt.Sprintf("idempotency: key %s: in progress (claim epoch %d of %q) for up to %v more", quoteKey(e.Key), e.Epoch, e.Owner, e.TimeLeft)
}

// Is reports whether target is ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// MismatchError reports that a key was first used with another request: the
// fingerprints differ. It matches ErrMismatch.
type MismatchError struct {
	// Key is the idempotency key, as the caller gave it.
	Key string
}

// Error names the key.
func (e *MismatchError) Error() string {
	return fmt.Sprintf("idempotency: key %s: reused with a different request (the fingerprint differs from the first request's)", quoteKey(e.Key))
}

// Is reports whether target is ErrMismatch.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// KeyError refuses a key (or a scope). It matches ErrInvalidKey and
// ErrInvalid. Nothing was sent.
type KeyError struct {
	// Key is the refused key, as the caller gave it.
	Key string
	// Reason says why.
	Reason string
}

// Error names the key (shortened if long) and the reason.
func (e *KeyError) Error() string {
	return fmt.Sprintf("idempotency: key %s: %s", quoteKey(e.Key), e.Reason)
}

// Is reports whether target is ErrInvalidKey or ErrInvalid.
func (e *KeyError) Is(target error) bool {
	return target == ErrInvalidKey || target == store.ErrInvalid
}

// OptionsError reports an Options or HTTPOptions field out of range. It
// matches ErrInvalid.
type OptionsError struct {
	// Field is the name of the field.
	Field string
	// Reason says what is wrong with its value.
	Reason string
}

// Error names the field and what is wrong with it.
func (e *OptionsError) Error() string {
	return fmt.Sprintf("idempotency: options: %s %s", e.Field, e.Reason)
}

// Is reports whether target is ErrInvalid.
func (e *OptionsError) Is(target error) bool { return target == store.ErrInvalid }

// UnknownOutcomeError reports a write whose reply was lost and whose
// outcome re-reading could not settle: it may or may not have been applied.
// It is [store.UnknownOutcomeError], the one such type of the library (its
// Pkg is "idempotency"); it matches ErrUnknownOutcome and unwraps to the
// write's error.
type UnknownOutcomeError = store.UnknownOutcomeError

// RecordGoneError reports that the key's record was deleted between its
// open and its claim each of the Opens times Do opened it (the retention
// clean-up deleting an expiring record that open had found, or another
// client deleting records). The function did not run and nothing of this
// call is left on the key: a retry opens the record afresh. It matches
// ErrUnknownOutcome, and unwraps to it and to the last loss's error (the
// claim's, matching lease.ErrNotFound, or open's read's).
type RecordGoneError struct {
	// Key is the idempotency key, as the caller gave it.
	Key string
	// Opens is how often Do opened the record.
	Opens int
	// Err is the error of the last claim, or of the last open.
	Err error
}

// Error names the key, the number of opens and the claim's error.
func (e *RecordGoneError) Error() string {
	return fmt.Sprintf("idempotency: key %s: the record was deleted between its open and its claim %d times; nothing ran: %v", quoteKey(e.Key), e.Opens, e.Err)
}

// Unwrap returns ErrUnknownOutcome and the claim's error.
func (e *RecordGoneError) Unwrap() []error { return []error{store.ErrUnknownOutcome, e.Err} }

// quoteKey quotes a key for a message, shortened if long.
func quoteKey(k string) string {
	const limit = 64
	if len(k) > limit {
		return fmt.Sprintf("%q...(%d bytes)", k[:limit], len(k))
	}
	return fmt.Sprintf("%q", k)
}

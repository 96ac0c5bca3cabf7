package idempotency

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/store"
)

// Sentinel errors. Every error the package returns for a key, except the
// caller's function's own, matches at most one of ErrInProgress,
// ErrMismatch, ErrInvalid, ErrLost and ErrUnknownOutcome; typed errors
// carry the facts.
var (
	// ErrInProgress is matched by *InProgressError: another request with
	// the key holds its claim. Nothing ran. HTTP: 409 with Retry-After.
	ErrInProgress = errors.New("a request with this key is in progress")

	// ErrMismatch is matched by *MismatchError: the key was first used with
	// a request of another fingerprint. Nothing ran. HTTP: 422.
	ErrMismatch = errors.New("key reused with a different request")

	// ErrInvalid is [store.ErrInvalid]: bad input, refused before anything
	// is sent. HTTP: 400.
	ErrInvalid = store.ErrInvalid

	// ErrInvalidKey is matched by the *KeyError that refuses a key: empty,
	// longer than [MaxKeyLen] bytes, not printable ASCII, or holding a "$".
	// It matches ErrInvalid too.
	ErrInvalidKey = fmt.Errorf("invalid idempotency key: %w", store.ErrInvalid)

	// ErrLost is [lease.ErrLost]: the claim on the key ended (expired, or
	// taken over) before the function's result or a checkpoint could be
	// recorded under it. A retry runs the function again, from the last
	// checkpoint.
	ErrLost = lease.ErrLost

	// ErrUnknownOutcome is [store.ErrUnknownOutcome]: a write of the key's
	// record failed ambiguously and re-reading it (for up to
	// Options.ResolveTimeout) could not tell whether it applied
	// (*UnknownOutcomeError), or the record was deleted before each of Do's
	// claims (*RecordGoneError: nothing ran).
	ErrUnknownOutcome = store.ErrUnknownOutcome
)

// InProgressError reports that another request with the same key holds the
// key's claim: it is running, or it died and its claim has not expired yet.
// It matches ErrInProgress.
type InProgressError struct {
	// Key is the idempotency key, as the caller gave it.
	Key string
	// Owner is the owner string of the claim's holder (its Options.Owner).
	Owner string
	// Epoch is the holder's claim epoch.
	Epoch int64
	// TimeLeft is the longest the claim can stay held without a renewal.
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

// KeyError refuses a key or a scope; nothing was sent. It matches
// ErrInvalidKey and ErrInvalid.
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
// outcome re-reading could not settle. It is [store.UnknownOutcomeError]
// (Pkg "idempotency"); it matches ErrUnknownOutcome.
type UnknownOutcomeError = store.UnknownOutcomeError

// RecordGoneError reports that the key's record was deleted (by the
// retention clean-up, or another client) between Do's read of it and its
// claim, each of the Opens times Do read it. The function did not run; a
// retry opens the key afresh. It unwraps to ErrUnknownOutcome and to the
// last claim's error (lease.ErrNotFound, or a duplicate key).
type RecordGoneError struct {
	// Key is the idempotency key, as the caller gave it.
	Key string
	// Opens is how often Do read the record.
	Opens int
	// Err is the error of the last claim.
	Err error
}

// Error names the key, the number of opens and the claim's error.
func (e *RecordGoneError) Error() string {
	return fmt.Sprintf("idempotency: key %s: the record was deleted before its claim %d times; nothing ran: %v", quoteKey(e.Key), e.Opens, e.Err)
}

// Unwrap returns ErrUnknownOutcome and the claim's error.
func (e *RecordGoneError) Unwrap() []error { return []error{store.ErrUnknownOutcome, e.Err} }

// quoteKey quotes a key for a message, shortened if long.
func quoteKey(k string) string {
	if len(k) > 64 {
		return fmt.Sprintf("%q...(%d bytes)", k[:64], len(k))
	}
	return strconv.Quote(k)
}

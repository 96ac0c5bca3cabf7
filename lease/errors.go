package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/mongocas/mongocas/store"
)

// Sentinel errors. Every error the package returns matches at most one of
// ErrHeld, ErrLost, ErrReleased, ErrNotFound, ErrInvalid and
// ErrUnknownOutcome through errors.Is, with two exceptions: an error from Do
// may also match the function's own error, and an Acquire whose context
// ended while another owner held the lease matches ErrHeld as well as what
// ended it. The typed errors below carry the facts.
var (
	// ErrHeld is matched by the *HeldError that TryAcquire returns when
	// another owner holds a live lease on the document or name.
	ErrHeld = errors.New("held by another owner")

	// ErrLost is matched by the *LostError returned when a lease is no
	// longer held by its owner: its local deadline passed, another owner
	// took it over, or someone else cleared the lease or deleted the
	// document.
	ErrLost = errors.New("lease lost")

	// ErrReleased is returned by Renew and Release on a lease that was
	// already released, and is the context.Cause of a lease's context after
	// a successful Release.
	ErrReleased = errors.New("lease released")

	// ErrNotFound is matched by the error a document-lease Manager returns
	// when the document to lease does not exist, and by the error of
	// [Lease.Stamp] on a document that does not exist. Nothing is written.
	ErrNotFound = errors.New("document not found")

	// ErrInvalid is [store.ErrInvalid]: bad input (an Options field, a nil
	// context or function, an id), refused before anything is sent.
	ErrInvalid = store.ErrInvalid

	// ErrInvalidID is [store.ErrInvalidID]: an id that cannot name a lease
	// or a document (nil, a zero value, or a value that could act as a query
	// operator, such as {"$gt": ""}). It matches ErrInvalid too. Nothing is
	// sent.
	ErrInvalidID = store.ErrInvalidID

	// ErrUnknownOutcome is [store.ErrUnknownOutcome], matched by the
	// *UnknownOutcomeError returned when a write failed ambiguously (network
	// error or timeout) and re-reading could not tell whether it was
	// applied.
	ErrUnknownOutcome = store.ErrUnknownOutcome
)

// HeldError reports that another owner holds a live lease. It matches ErrHeld.
// A service answering "409 Conflict" can send TimeLeft as Retry-After.
type HeldError struct {
	// ID is the _id of the leased document, or the name of a named lease.
	ID any
	// Owner is the holder's owner string.
	Owner string
	// Epoch is the holder's fencing token.
	Epoch int64
	// ExpiresAt is the lease's expiry, on the server's clock.
	ExpiresAt time.Time
	// TimeLeft is the longest this Manager would now wait before it may find
	// the lease expired: ExpiresAt minus the server's time (read with the
	// record in ModeServer, the earliest the estimate allows in
	// ModeEstimated), plus a millisecond. A renewal by the holder extends it.
	TimeLeft time.Duration
}

// Error returns a message naming the holder, its epoch and the time left.
func (e *HeldError) Error() string {
	return fmt.Sprintf("lease: %v is held by %q (epoch %d) for up to %v more", e.ID, e.Owner, e.Epoch, e.TimeLeft)
}

// Is reports whether target is ErrHeld.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// Reason tells why a lease was lost.
type Reason int

const (
	// Expired means the holder's local deadline passed before a renewal
	// succeeded, so another owner may now see the lease as expired.
	Expired Reason = iota + 1
	// TakenOver means the lease record carries another owner or a later
	// epoch (for a fence stamp: a later epoch was stamped).
	TakenOver
	// Cleared means the lease record has no owner although this holder
	// never released it, or the document is gone.
	Cleared
	// Unread means a renewal or release found the record no longer naming
	// this holder and epoch, and re-reading it to learn more failed. The
	// lease is treated as lost, which is the safe side; Err carries the
	// re-read's error.
	Unread
)

// reasons are the Reasons in words, and as observe.Event.Reason has them.
var reasons = [...][2]string{
	Expired:   {"expired", "expired"},
	TakenOver: {"taken over", "taken_over"},
	Cleared:   {"cleared", "cleared"},
	Unread:    {"lost (the re-read of the record failed)", "unread"},
}

// String returns the reason in words, such as "taken over".
func (r Reason) String() string {
	if r > 0 && int(r) < len(reasons) {
		return reasons[r][0]
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// LostError reports that a lease is no longer held by this owner. It matches
// ErrLost and, when Err is set, Err too. It is the context.Cause of a lost
// lease's context.
type LostError struct {
	// ID is the _id of the leased document, or the name of a named lease.
	ID any
	// Owner and Epoch identify the lease that was lost.
	Owner string
	// Epoch is the fencing token of the lease that was lost.
	Epoch int64
	// Reason tells why.
	Reason Reason
	// Holder and HolderEpoch describe the lease record as last read, when it
	// was read: the new holder after a takeover, empty otherwise.
	Holder string
	// HolderEpoch is the epoch of the record (or of the fence stamp) as last
	// read, 0 if unknown.
	HolderEpoch int64
	// Err is the error of the function Do ran, when the lease was lost while
	// it ran, or the re-read's error for Reason Unread; nil otherwise.
	Err error
}

// Error returns a message naming the lease, the reason, the new holder if
// known, and the function's error if any.
func (e *LostError) Error() string {
	msg := fmt.Sprintf("lease: lost %v (owner %q, epoch %d): %v", e.ID, e.Owner, e.Epoch, e.Reason)
	if e.Holder != "" {
		msg += fmt.Sprintf(", now held by %q (epoch %d)", e.Holder, e.HolderEpoch)
	} else if e.Reason == TakenOver && e.HolderEpoch != 0 {
		msg += fmt.Sprintf(", epoch %d stamped since", e.HolderEpoch)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns ErrLost and, if set, the function's error.
func (e *LostError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrLost, e.Err}
	}
	return []error{ErrLost}
}

// withErr returns a copy of e that carries err.
func (e *LostError) withErr(err error) *LostError {
	c := *e
	c.Err = err
	return &c
}

// OptionsError reports an Options field out of range. It matches ErrInvalid.
type OptionsError struct {
	// Field is the name of the Options field.
	Field string
	// Reason says what is wrong with its value.
	Reason string
}

// Error returns a message naming the field and what is wrong with it.
func (e *OptionsError) Error() string {
	return fmt.Sprintf("lease: invalid options: %s %s", e.Field, e.Reason)
}

// Is reports whether target is ErrInvalid.
func (e *OptionsError) Is(target error) bool { return target == ErrInvalid }

// UnknownOutcomeError reports a write whose reply was lost and whose
// outcome re-reading could not settle: it may or may not have been applied.
// It is [store.UnknownOutcomeError], the one such type of the library (its
// Pkg is "lease"); it matches ErrUnknownOutcome and unwraps to the
// write's error.
type UnknownOutcomeError = store.UnknownOutcomeError

// joined is an error with its own message that matches every error in errs.
type joined struct {
	msg  string
	errs []error
}

func (e *joined) Error() string   { return e.msg }
func (e *joined) Unwrap() []error { return e.errs }

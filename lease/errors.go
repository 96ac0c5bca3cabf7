package lease

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Every error the package returns matches at most one of
// them through errors.Is, with two exceptions: an error from Do may also
// match the function's own error, and an Acquire whose context ended while
// another owner held the lease matches ErrHeld as well as what ended it. The
// typed errors below carry the facts.
var (
	// ErrHeld is matched by the *HeldError that TryAcquire returns when
	// another owner holds a live lease on the document or name.
	ErrHeld = errors.New("lease: held by another owner")

	// ErrLost is matched by the *LostError returned when a lease is no
	// longer held by its owner: its local deadline passed, another owner
	// took it over, or someone else cleared the lease or deleted the
	// document.
	ErrLost = errors.New("lease: lost")

	// ErrReleased is returned by Renew and Release on a lease that was
	// already released, and is the context.Cause of a lease's context after
	// a successful Release.
	ErrReleased = errors.New("lease: released")

	// ErrNotFound is matched by the error a document-lease Manager returns
	// when the document to lease does not exist. Nothing is written.
	ErrNotFound = errors.New("lease: document not found")

	// ErrInvalidOptions is matched by the *OptionsError that New and NewNamed
	// return for an Options field out of range.
	ErrInvalidOptions = errors.New("lease: invalid options")

	// ErrInvalidID is matched by the error returned for an id that cannot
	// name a lease: nil, an empty string or a zero ObjectID. Nothing is
	// written.
	ErrInvalidID = errors.New("lease: invalid id")

	// ErrUncertain is matched by the *UncertainError returned when a write
	// failed ambiguously (network error or timeout) and the document could
	// not be re-read to learn whether it was applied.
	ErrUncertain = errors.New("lease: outcome unknown")
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
	// TimeLeft is the longest this Manager would now wait before it may
	// judge the lease expired: ExpiresAt minus the earliest the server's
	// clock can read, plus a millisecond. A renewal by the holder extends
	// it.
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
	// epoch.
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

// String returns the reason in words, such as "taken over".
func (r Reason) String() string {
	switch r {
	case Expired:
		return "expired"
	case TakenOver:
		return "taken over"
	case Cleared:
		return "cleared"
	case Unread:
		return "lost (the re-read of the record failed)"
	default:
		return fmt.Sprintf("Reason(%d)", int(r))
	}
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
	// HolderEpoch is the epoch of the record as last read, 0 if unknown.
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

// OptionsError reports an Options field out of range. It matches
// ErrInvalidOptions.
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

// Is reports whether target is ErrInvalidOptions.
func (e *OptionsError) Is(target error) bool { return target == ErrInvalidOptions }

// UncertainError reports a write whose outcome is unknown: it failed with a
// network error or a timeout (store.IsAmbiguous), and re-reading the document
// failed too. It matches ErrUncertain and unwraps to both errors, so
// store.IsNetwork and the like still answer.
//
// After an uncertain acquire the lease may be held by this owner until it
// expires; after an uncertain release it may stay held until it expires. In
// neither case can two owners hold it at once.
type UncertainError struct {
	// Op is "acquire", "renew" or "release".
	Op string
	// ID is the _id of the leased document, or the name of a named lease.
	ID any
	// Err is the ambiguous error of the write.
	Err error
	// ReadErr is the error of the re-read.
	ReadErr error
}

// Error returns a message with the operation, the write's error and the
// re-read's error.
func (e *UncertainError) Error() string {
	return fmt.Sprintf("lease: %s %v: outcome unknown: %v; re-read failed: %v", e.Op, e.ID, e.Err, e.ReadErr)
}

// Unwrap returns ErrUncertain, the write's error and the re-read's error.
func (e *UncertainError) Unwrap() []error { return []error{ErrUncertain, e.Err, e.ReadErr} }

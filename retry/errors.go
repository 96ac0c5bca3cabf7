package retry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mongocas/mongocas/store"
)

// Sentinel errors, matched with errors.Is by the typed errors below, which
// carry the facts.
var (
	// ErrInvalidPolicy: a Policy field (or its Budget) is out of range.
	ErrInvalidPolicy = errors.New("retry: invalid policy")
	// ErrExhausted: fn kept failing with a retryable error until
	// MaxAttempts or MaxElapsedTime ran out.
	ErrExhausted = errors.New("retry: attempts exhausted")
	// ErrBudgetExhausted: fn failed with a retryable error, but the shared
	// retry Budget had no token left.
	ErrBudgetExhausted = errors.New("retry: retry budget exhausted")
)

// ConfigError reports an invalid Policy field. It matches ErrInvalidPolicy.
type ConfigError struct {
	// Field is the offending Policy field, such as "Multiplier", or
	// "Budget" for a Budget made with invalid arguments.
	Field string
	// Reason says what is wrong with the value.
	Reason string
}

// Error returns a message that names the field and the reason.
func (e *ConfigError) Error() string {
	return "retry: invalid policy: " + e.Field + ": " + e.Reason
}

// Is reports whether target is ErrInvalidPolicy.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidPolicy }

// ExhaustedError is returned by Do when fn failed with a retryable error and
// another attempt would exceed MaxAttempts or MaxElapsedTime. It matches
// ErrExhausted and whatever Last matches. It is not retryable, so a Do
// nested inside another does not multiply retries.
type ExhaustedError struct {
	// Attempts is the number of calls of fn that were made.
	Attempts int
	// Elapsed is the time spent since the first call, measured on the
	// Policy's Clock.
	Elapsed time.Duration
	// Last is the error of the last call of fn.
	Last error
}

// Error returns a message with the number of attempts, the time spent and the
// last error.
func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("retry: gave up after %d attempts in %v: %v", e.Attempts, e.Elapsed, e.Last)
}

// Unwrap returns ErrExhausted and Last.
func (e *ExhaustedError) Unwrap() []error { return []error{ErrExhausted, e.Last} }

// Retryable reports false: the retries are used up.
func (e *ExhaustedError) Retryable() bool { return false }

// BudgetExhaustedError is returned by Do when fn failed with a retryable
// error and the Policy's Budget had no token left for another attempt. It
// matches ErrBudgetExhausted and whatever Last matches. It is not retryable,
// so an outer retry loop does not defeat the budget.
type BudgetExhaustedError struct {
	// Attempts is the number of calls of fn that were made.
	Attempts int
	// Last is the error of the last call of fn.
	Last error
}

// Error returns a message with the number of attempts and the last error.
func (e *BudgetExhaustedError) Error() string {
	return fmt.Sprintf("retry: retry budget exhausted after %d attempts: %v", e.Attempts, e.Last)
}

// Unwrap returns ErrBudgetExhausted and Last.
func (e *BudgetExhaustedError) Unwrap() []error { return []error{ErrBudgetExhausted, e.Last} }

// Retryable reports false: the budget says to stop retrying.
func (e *BudgetExhaustedError) Retryable() bool { return false }

// newStoppedError builds the error of a Do whose context ended after the
// given number of attempts: it wraps store.ContextError(ctx) and last, fn's
// last error (nil if fn was never called).
func newStoppedError(ctx context.Context, attempts int, last error) error {
	err := fmt.Errorf("retry: stopped after %d attempts: %w", attempts, store.ContextError(ctx))
	if last != nil {
		err = fmt.Errorf("%w; last error: %w", err, last)
	}
	return err
}

// Permanent wraps err so that Do stops at once and returns err itself (not the
// wrapper). Anywhere in an error chain, it makes IsRetryable report false.
// The wrapper has err's message and unwraps to err. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was made by
// Permanent.
func IsPermanent(err error) bool {
	var pe *permanentError
	return errors.As(err, &pe)
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Immediately wraps a retryable err so that Do makes its next attempt at
// once: no sleep, and the backoff sequence does not advance; the rest of the
// retry is as usual (OnRetry and the Observer get Delay 0), and an error Do
// returns holds err, not the wrapper. Use it when the failure brought what
// the next attempt needs. Only the outermost error fn returns is looked at.
// Immediately(nil) returns nil.
func Immediately(err error) error {
	if err == nil {
		return nil
	}
	return &immediateError{err: err}
}

type immediateError struct{ err error }

func (e *immediateError) Error() string { return e.err.Error() }
func (e *immediateError) Unwrap() error { return e.err }

// Retryable is implemented by error types that know whether the operation
// that failed may be tried again, such as a version conflict (true) or an
// error that needs a re-read first (false). IsRetryable finds it anywhere in
// an error chain.
type Retryable interface {
	// Retryable reports whether the failed operation may be tried again.
	Retryable() bool
}

// IsRetryable reports whether an operation that failed with err may pass if
// it is tried again. It looks at types and error labels through errors.Is and
// errors.As, never at message text, so wrapping keeps the answer. In order:
//
//   - nil, or an error made by Permanent anywhere in the chain: false.
//   - context.Canceled or context.DeadlineExceeded anywhere in the chain:
//     false, since IsRetryable cannot tell whether the caller's own context
//     ended (Do, which can, retries a deadline error while it is live).
//   - a Retryable in the chain: its answer. The first one errors.As finds
//     decides, so an outer error that says false overrides a transient error
//     it wraps.
//   - otherwise store.IsTransient(err).
func IsRetryable(err error) bool {
	return classify(err, false)
}

// classify implements IsRetryable; with callerLive, a deadline error in err
// came from a per-attempt timeout and may be retried.
func classify(err error, callerLive bool) bool {
	if err == nil || IsPermanent(err) || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) &&
		(!callerLive || store.IsDeadlineTooClose(err)) {
		return false
	}
	var r Retryable
	if errors.As(err, &r) {
		return r.Retryable()
	}
	return store.IsTransient(err)
}

// Package retry retries operations against MongoDB that may pass on a second
// try: version conflicts of optimistic writes, write conflicts, network errors
// and timeouts. It provides jittered exponential backoff policies with short
// budgets fit for request paths, one classification of what is retryable, and
// a retry budget that caps retries during conflict storms.
//
// The usual call wraps one operation that may fail transiently, here a
// write the server may answer with a write conflict or a network error:
//
//	err := retry.Do(ctx, retry.Policy{}, func(ctx context.Context) error {
//		_, err := orders.UpdateOne(ctx, bson.D{{"_id", id}, {"status", "new"}},
//			bson.D{{"$set", bson.D{{"status", "paid"}}}})
//		return err
//	})
//
// (The versioned package's Modify runs its own loop on this package: give it
// a [Policy] through its options rather than wrapping it in Do.)
//
// The zero Policy means the defaults: full-jitter exponential backoff whose
// cap starts at 5ms and doubles up to 200ms, at most 10 attempts and at most
// 2s in all. A retry [Budget], hooks for logs and metrics (OnRetry, and an
// [observe.Observer] that gets a Retry or BudgetRefused event), and, for
// tests, a [store.Clock] and a random source are set on the [Policy]. [DoValue] is [Do] for
// functions that return a value; [Policy.NewBackoff] gives the bare delay
// sequence to loops that Do does not fit.
//
// The exponential part comes from github.com/cenkalti/backoff/v4, which this
// package keeps out of its API so that a move to a later major version
// touches this package only.
//
// # Classification
//
// [IsRetryable] decides, through errors.Is and errors.As only (never the text
// of a message), so that wrapping with %w or errors.Join keeps the answer:
// [Permanent] and context cancellation or deadline mean no; an error type that
// implements [Retryable] (such as the versioned package's conflict error)
// answers for itself; otherwise [store.IsTransient] decides (network errors,
// timeouts, write conflicts, the RetryableWriteError and
// TransientTransactionError labels). Do adds one refinement: a deadline error
// while the caller's context is still live is a per-attempt timeout and is
// retried. An fn whose failure brought what its next attempt needs (a
// conflict reply that carries the current document) returns its error
// wrapped by [Immediately]: the retry comes without a sleep, and counts
// like any other.
//
// Retrying is only safe for operations that are idempotent or that detect
// their own earlier success: after a network error or a timeout a write may
// have been applied (see [store.IsAmbiguous]). The versioned package's
// read-modify-write loop re-reads before it writes again, which makes it so.
//
// # Guarantees
//
//   - fn is called at most MaxAttempts times (unless MaxAttempts is
//     negative). Do checks ctx before the first call and after every sleep,
//     and once it has seen ctx end it does not call fn again.
//   - Every delay is in [0, MaxInterval], within the bounds that its Jitter
//     documents. Do never starts a sleep that would end after
//     MaxElapsedTime (measured on the Policy's Clock from the first call).
//   - Cancelling ctx interrupts a sleep at once.
//   - Each retry, never a first attempt, takes exactly one token from the
//     Policy's Budget, and no retry happens without one, however many
//     goroutines share the Budget.
//   - OnRetry, then the Observer's Retry event, come once before each sleep,
//     on the goroutine of Do, in order; a refusal by the Budget is one
//     BudgetRefused event. With no Observer, no event is built.
//   - A call whose first attempt succeeds makes no allocation and no sleep.
//   - Do starts no goroutine: when it returns, nothing of it runs on.
//   - With a fake Clock and a fixed Rand, the delays, and so Do's behaviour,
//     are deterministic.
//
// # Errors
//
// Do returns nil on success and, otherwise, one of these:
//
//   - [*ConfigError], which matches [ErrInvalidPolicy]: a Policy field is out of
//     range (a negative interval, a Multiplier below 1, an unknown Jitter, a
//     Budget made with invalid arguments). [Policy.Validate] returns the same
//     error. Do returns it before calling fn.
//   - The error of fn itself, when it is not retryable, so errors.Is and
//     errors.As on it behave as if Do were not there. An error wrapped by
//     [Permanent] is returned as the error given to Permanent, and so is one
//     wrapped by [Immediately].
//   - [*ExhaustedError], which matches [ErrExhausted]: fn failed with a retryable
//     error and MaxAttempts or MaxElapsedTime leaves no room for another
//     attempt. It carries the number of attempts, the time spent and the last
//     error, and it also matches whatever that last error matches.
//   - [*BudgetExhaustedError], which matches [ErrBudgetExhausted]: fn failed with
//     a retryable error and the shared Budget had no token left. It carries
//     the number of attempts and the last error, and it also matches
//     whatever that last error matches.
//   - An error that wraps ctx.Err(), and context.Cause(ctx) if that differs,
//     together with the last error of fn (if fn was called), when ctx ended.
//     errors.Is(err, context.Canceled) or errors.Is(err,
//     context.DeadlineExceeded) holds, and so does errors.Is(err, e) for any e
//     the last error matches.
//
// ExhaustedError and BudgetExhaustedError report false from their Retryable
// method, so a Do nested in another Do does not retry a loop that has already
// given up.
package retry

// Package retry retries operations against MongoDB that may pass on a second
// try: version conflicts of optimistic writes, write conflicts, network errors
// and timeouts. It provides jittered exponential backoff with short budgets
// fit for request paths, one classification of what is retryable, and a
// retry budget that caps retries during conflict storms.
//
//	err := retry.Do(ctx, retry.Policy{}, func(ctx context.Context) error {
//		_, err := orders.UpdateOne(ctx, bson.D{{"_id", id}, {"status", "new"}},
//			bson.D{{"$set", bson.D{{"status", "paid"}}}})
//		return err
//	})
//
// (versioned's Modify runs its own loop on this package: give it a [Policy]
// through its options rather than wrapping it in Do.)
//
// The zero Policy means the defaults: full-jitter exponential backoff (on
// backoff/v4, see below) whose cap starts at 5ms and doubles up to 200ms, at
// most 10 attempts and at most 2s in all. A retry [Budget], hooks (OnRetry, and an [observe.Observer] that
// gets Retry and BudgetRefused events) and, for tests, a [store.Clock] and a
// random source are set on the [Policy]. [DoValue] is [Do] for functions that
// return a value; [Policy.NewBackoff] gives the bare delay sequence to loops
// that Do does not fit.
//
// # On backoff/v4
//
// The delays come from github.com/cenkalti/backoff/v4: each call of Do that
// sleeps (and each [Policy.NewBackoff]) builds its own ExponentialBackOff,
// which is not safe for concurrent use, from InitialInterval, MaxInterval and
// Multiplier, on the Policy's Clock. This package adds what
// backoff/v4 lacks: the retry [Budget], the hooks, the classification below,
// [Immediately], and the typed errors that say which limit ended the loop.
// Three Policy fields do not map onto ExponentialBackOff as they stand:
//
//   - Jitter and Rand. ExponentialBackOff randomizes symmetrically, in
//     [(1−f)×interval, (1+f)×interval] for a RandomizationFactor f, which
//     may pass MaxInterval, and draws from math/rand's global source, which a
//     test cannot fix. So its RandomizationFactor is 0 (it returns the cap
//     itself) and the delay is drawn below the cap with Rand, as Jitter says.
//     DecorrelatedJitter depends on the previous delay, which
//     ExponentialBackOff does not keep: it has its own recurrence.
//   - MaxElapsedTime. ExponentialBackOff stops when the elapsed time plus its
//     interval passes MaxElapsedTime; here that interval is the cap, so it
//     would refuse a drawn delay that fits, and its elapsed time starts when
//     it is made, at the first sleep. Do applies the same rule to the delay it
//     will sleep, from the first call of fn on the Policy's Clock; a call
//     that only retries at once ([Immediately], as versioned's Modify after
//     a conflict) makes no ExponentialBackOff at all.
//
// MaxAttempts and the context are checked by Do rather than through
// backoff.WithMaxRetries and backoff.WithContext: Do must tell an
// [*ExhaustedError] from the context's end, and interrupt a sleep at once,
// where those wrappers only answer Stop; and each would be one more
// allocation per retried call.
//
// # Classification
//
// [IsRetryable] decides through errors.Is and errors.As only, never message
// text, so wrapping keeps the answer: [Permanent] and context errors mean
// no; an error that implements [Retryable] answers for itself; otherwise
// [store.IsTransient] decides. Do also retries a deadline error while the
// caller's context is still live (a per-attempt timeout). [Immediately] makes
// the next attempt come without a sleep. Retrying is only safe for operations
// that are idempotent or detect their own earlier success: after a network
// error or a timeout a write may have been applied (see [store.IsAmbiguous]).
//
// # Guarantees
//
//   - fn is called at most MaxAttempts times (unless MaxAttempts is
//     negative). Do checks ctx before the first call and after every sleep,
//     and once it has seen ctx end it does not call fn again.
//   - Every delay is in [0, MaxInterval], within the bounds its Jitter
//     documents. Do never starts a sleep that would end after
//     MaxElapsedTime (on the Policy's Clock, from the first call).
//   - Cancelling ctx interrupts a sleep at once.
//   - Each retry, never a first attempt, takes exactly one token from the
//     Policy's Budget, and no retry happens without one, however many
//     goroutines share the Budget.
//   - OnRetry, then the Observer's Retry event, come once before each sleep,
//     on the goroutine of Do, in order; a refusal by the Budget is one
//     BudgetRefused event. With no Observer, no event is built.
//   - A call whose first attempt succeeds makes no allocation and no sleep.
//   - Do starts no goroutine: when it returns, nothing of it runs on.
//   - With a fake Clock and a fixed Rand, Do's behaviour is deterministic.
//
// # Errors
//
// [Do] returns nil, fn's own error when it is not retryable, a
// [*ConfigError] ([ErrInvalidPolicy]) before calling fn, an
// [*ExhaustedError] ([ErrExhausted]), a [*BudgetExhaustedError]
// ([ErrBudgetExhausted]), or the context's error wrapped with fn's last one
// (see Do for each case). The last three also match whatever fn's last error
// matches; the exhausted errors report false from Retryable, so a nested Do
// does not retry a loop that has already given up.
package retry

package retry

import (
	"context"
	"time"

	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/store"
)

// Attempt describes a failed attempt that Do is about to retry, for OnRetry.
type Attempt struct {
	// Number is the 1-based number of the attempt that failed.
	Number int
	// Err is the error that attempt returned.
	Err error
	// Delay is how long Do sleeps before the next attempt.
	Delay time.Duration
	// Elapsed is the time since the first attempt started, measured on the
	// Policy's Clock when the attempt failed.
	Elapsed time.Duration
}

// Do calls fn with ctx until it succeeds, fails with an error that is not
// retryable, or the Policy, its Budget or ctx says to stop. It returns:
//
//   - nil, as soon as fn returns nil;
//   - a *ConfigError (ErrInvalidPolicy) if p is invalid, without calling fn;
//   - fn's error itself if it is not retryable (see IsRetryable); one that
//     Permanent or Immediately made is returned as the error given to it;
//   - an *ExhaustedError (ErrExhausted) when another attempt would exceed
//     MaxAttempts, or its sleep would end after MaxElapsedTime;
//   - a *BudgetExhaustedError (ErrBudgetExhausted) when the Policy's Budget
//     has no token for another attempt;
//   - when ctx ends (before the first attempt, after a retryable failure or
//     during a sleep, which it interrupts at once), an error that wraps
//     ctx.Err(), context.Cause(ctx) if it differs, and fn's last error; Do
//     then calls fn no more.
//
// Do classifies errors as IsRetryable does, except that a
// context.DeadlineExceeded from fn while ctx is still live (a per-attempt or
// the driver's operation timeout) is retried if it is otherwise retryable.
// Before each retry Do computes the delay (see Policy), checks MaxAttempts and
// MaxElapsedTime, takes a Budget token, calls OnRetry, and sleeps on the
// Policy's Clock (not after an error made by Immediately). A call that
// succeeds at once makes no allocation.
func Do(ctx context.Context, p Policy, fn func(ctx context.Context) error) error {
	if err := p.Validate(); err != nil {
		return err
	}
	s := p.resolve()
	return do(ctx, &s, fn)
}

// DoValue is Do for a function that also returns a value. It returns fn's
// value when fn succeeds, and the zero value of T with the error otherwise.
func DoValue[T any](ctx context.Context, p Policy, fn func(ctx context.Context) (T, error)) (T, error) {
	var v T
	err := Do(ctx, p, func(ctx context.Context) (err error) {
		v, err = fn(ctx)
		return err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

func do(ctx context.Context, s *settings, fn func(ctx context.Context) error) error {
	if ctx.Err() != nil {
		return newStoppedError(ctx, 0, nil)
	}
	start := s.clock.Now()
	var seq *sequence // made at the first sleep: a first-try success, or a retry at once, allocates nothing
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		now := false
		for {
			ie, ok := err.(*immediateError) //nolint:errorlint // only fn's own outer wrappers
			if !ok {
				break
			}
			err, now = ie.err, true
		}
		live := ctx.Err() == nil
		if !classify(err, live) {
			return unwrapOurs(err)
		}
		if !live {
			return newStoppedError(ctx, attempt, err)
		}
		elapsed := s.clock.Now().Sub(start)
		if s.maxAttempts > 0 && attempt >= s.maxAttempts {
			return &ExhaustedError{Attempts: attempt, Elapsed: elapsed, Last: err}
		}
		var delay time.Duration
		if !now {
			if seq == nil {
				seq = newSequence(s)
			}
			delay = seq.Next()
		}
		// ExponentialBackOff's own MaxElapsedTime would compare the cap, not
		// the delay drawn below it (see doc.go): the same rule, on the delay.
		if s.maxElapsed > 0 && elapsed+delay > s.maxElapsed {
			return &ExhaustedError{Attempts: attempt, Elapsed: elapsed, Last: err}
		}
		if s.budget != nil && !s.budget.take(s.clock) {
			s.observe(ctx, observe.BudgetRefused, attempt, 0, err)
			return &BudgetExhaustedError{Attempts: attempt, Last: err}
		}
		if s.onRetry != nil {
			s.onRetry(Attempt{Number: attempt, Err: err, Delay: delay, Elapsed: elapsed})
		}
		s.observe(ctx, observe.Retry, attempt, delay, err)
		if !sleep(ctx, s.clock, delay) {
			return newStoppedError(ctx, attempt, err)
		}
	}
}

// sleep waits for d on clock, and reports whether ctx is still live.
func sleep(ctx context.Context, clock store.Clock, d time.Duration) bool {
	if d > 0 {
		t := clock.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C():
		}
	}
	return ctx.Err() == nil
}

// observe sends an event about the failed attempt to the Observer, if any.
func (s *settings) observe(ctx context.Context, k observe.Kind, attempt int, delay time.Duration, err error) {
	if s.observer != nil {
		s.observer.Observe(ctx, observe.Event{Kind: k, Attempt: attempt, Delay: delay, Err: err})
	}
}

// unwrapOurs strips the wrappers Permanent and Immediately made from the
// outside of err, and keeps the caller's chain below them.
func unwrapOurs(err error) error {
	for {
		switch e := err.(type) { //nolint:errorlint // strip only our own outer wrappers, keep the caller's chain
		case *permanentError:
			err = e.err
		case *immediateError:
			err = e.err
		default:
			return err
		}
	}
}

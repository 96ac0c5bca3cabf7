package retry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// fast returns a Policy on a fake clock with NoJitter delays 10, 20, 40, 80,
// 100, 100, … ms, unlimited attempts and elapsed time.
func fast(clock store.Clock) retry.Policy {
	return retry.Policy{
		InitialInterval: 10 * ms,
		MaxInterval:     100 * ms,
		Jitter:          retry.NoJitter,
		MaxAttempts:     -1,
		MaxElapsedTime:  -1,
		Clock:           clock,
	}
}

func TestDoSucceedsAtOnce(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	fn, calls := counter(nil)
	require.NoError(t, retry.Do(context.Background(), retry.Policy{Clock: clock}, fn))
	require.Equal(t, 1, calls())
	require.Empty(t, clock.Sleeps())
}

func TestDoRetriesUntilSuccess(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		err  error
	}{
		{"Retryable", errConflict},
		{"wrapped Retryable", fmt.Errorf("save %q: %w", "doc-1", errConflict)},
		{"joined Retryable", errors.Join(errBoom, errConflict)},
		{"driver network error", errNetwork},
		{"wrapped driver network error", fmt.Errorf("update: %w", errNetwork)},
		{"write conflict", errWriteConflict},
		{"RetryableWriteError", errRetryableWr},
		// The caller's context is live, so this deadline is a per-attempt one.
		{"per-attempt deadline", fmt.Errorf("find: %w", context.DeadlineExceeded)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			fn, calls := counter(tc.err, tc.err, nil)
			require.NoError(t, retry.Do(context.Background(), fast(clock), fn))
			require.Equal(t, 3, calls())
			require.Equal(t, []time.Duration{10 * ms, 20 * ms}, clock.Sleeps())
		})
	}
}

func TestDoStopsOnNonRetryable(t *testing.T) {
	t.Parallel()
	wrapped := fmt.Errorf("save: %w", errBoom)
	for _, want := range []error{errBoom, wrapped, errDuplicateKey, &retryableError{retry: false, err: errNetwork}} {
		clock := newFakeClock()
		fn, calls := counter(want)
		err := retry.Do(context.Background(), fast(clock), fn)
		require.Equal(t, want, err) // as is, not wrapped
		require.Equal(t, 1, calls())
		require.Empty(t, clock.Sleeps())
	}
}

func TestDoPermanent(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()

	// Permanent beats a transient error, and Do returns the error given to it.
	fn, calls := counter(retry.Permanent(errNetwork))
	err := retry.Do(context.Background(), fast(clock), fn)
	require.Equal(t, 1, calls())
	require.Equal(t, errNetwork.Error(), err.Error())
	require.False(t, retry.IsPermanent(err))

	inner := fmt.Errorf("lookup: %w", errBoom)
	fn, calls = counter(errConflict, retry.Permanent(inner))
	err = retry.Do(context.Background(), fast(clock), fn)
	require.Equal(t, 2, calls())
	require.Same(t, inner, err)
	require.ErrorIs(t, err, errBoom)

	// A Permanent deeper in the chain stops too; the chain is returned as is.
	outer := fmt.Errorf("repo: %w", retry.Permanent(errConflict))
	fn, calls = counter(outer)
	err = retry.Do(context.Background(), fast(clock), fn)
	require.Equal(t, 1, calls())
	require.Same(t, outer, err)
	require.ErrorIs(t, err, errConflict)
	require.Equal(t, []time.Duration{10 * ms}, clock.Sleeps())
}

func TestDoMaxAttempts(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 3, 7, 10} {
		clock := newFakeClock()
		p := fast(clock)
		p.MaxAttempts = n
		lastErr := fmt.Errorf("attempt %d: %w", n, errConflict)
		errs := make([]error, n+5)
		for i := range errs {
			errs[i] = errConflict
		}
		errs[n-1] = lastErr
		fn, calls := counter(errs...)
		err := retry.Do(context.Background(), p, fn)
		require.Equal(t, n, calls())
		require.Len(t, clock.Sleeps(), n-1)
		require.ErrorIs(t, err, retry.ErrExhausted)
		require.ErrorIs(t, err, errConflict)
		var ex *retry.ExhaustedError
		require.ErrorAs(t, err, &ex)
		require.Equal(t, n, ex.Attempts)
		require.Same(t, lastErr, ex.Last)
	}
}

func TestDoDefaultPolicy(t *testing.T) {
	t.Parallel()
	// Zero Policy: 10 attempts. With full jitter the caps sum to 915ms, below
	// the 2s default, so MaxAttempts decides whatever Rand returns.
	for _, p := range []retry.Policy{{}, retry.Default()} {
		clock := newFakeClock()
		p.Clock = clock
		fn, calls := counter(errNetwork)
		err := retry.Do(context.Background(), p, fn)
		require.Equal(t, 10, calls())
		require.ErrorIs(t, err, retry.ErrExhausted)
		caps := []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 200 * ms, 200 * ms, 200 * ms}
		sleeps := clock.Sleeps()
		require.Len(t, sleeps, 9)
		for i, d := range sleeps {
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.Less(t, d, caps[i])
		}
	}
}

func TestDoMaxElapsedTime(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		maxElapsed time.Duration
		work       time.Duration // fake time each call of fn takes
		calls      int
		elapsed    time.Duration // when the last call failed
	}{
		// Calls start at 0, 10, 30, 70, 150 ms; the next would start at 250.
		{"between attempts", 200 * ms, 0, 5, 150 * ms},
		// A sleep that ends exactly at MaxElapsedTime is allowed.
		{"exact", 250 * ms, 0, 6, 250 * ms},
		{"just below", 250*ms - 1, 0, 5, 150 * ms},
		// Each call takes 5ms: calls start at 0, 15, 40, 85; the 4th fails at 90,
		// and 90+80 > 150.
		{"slow fn", 150 * ms, 5 * ms, 4, 90 * ms},
		// Not even one retry fits.
		{"tiny", 9 * ms, 0, 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			p := fast(clock)
			p.MaxElapsedTime = tc.maxElapsed
			calls := 0
			err := retry.Do(context.Background(), p, func(context.Context) error {
				calls++
				clock.Advance(tc.work)
				return errNetwork
			})
			require.Equal(t, tc.calls, calls)
			var ex *retry.ExhaustedError
			require.ErrorAs(t, err, &ex)
			require.Equal(t, tc.calls, ex.Attempts)
			require.Equal(t, tc.elapsed, ex.Elapsed)
			// Never slept past MaxElapsedTime.
			require.LessOrEqual(t, clock.Now().Sub(epoch), tc.maxElapsed)
		})
	}
}

func TestDoOnRetry(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	p := fast(clock)
	p.MaxAttempts = 3
	var got []retry.Attempt
	p.OnRetry = func(a retry.Attempt) { got = append(got, a) }
	err1, err2, err3 := fmt.Errorf("1: %w", errConflict), fmt.Errorf("2: %w", errConflict), fmt.Errorf("3: %w", errConflict)
	errs := []error{err1, err2, err3}
	calls := 0
	err := retry.Do(context.Background(), p, func(context.Context) error {
		clock.Advance(ms) // each call takes 1ms
		calls++
		return errs[calls-1]
	})
	require.ErrorIs(t, err, retry.ErrExhausted)
	require.Equal(t, []retry.Attempt{
		{Number: 1, Err: err1, Delay: 10 * ms, Elapsed: 1 * ms},
		{Number: 2, Err: err2, Delay: 20 * ms, Elapsed: 12 * ms},
	}, got)
	var ex *retry.ExhaustedError
	require.ErrorAs(t, err, &ex)
	require.Equal(t, retry.ExhaustedError{Attempts: 3, Elapsed: 33 * ms, Last: err3}, *ex)
}

// runDo runs Do on another goroutine and returns a channel with its result.
func runDo(ctx context.Context, p retry.Policy, fn func(context.Context) error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- retry.Do(ctx, p, fn) }()
	return done
}

// result waits for Do's result; Do must return promptly, as it is not sleeping.
func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Do did not return")
		return nil
	}
}

func TestDoCancelDuringSleep(t *testing.T) {
	t.Parallel()
	clock := newBlockingClock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lastErr := fmt.Errorf("update: %w", errNetwork)
	fn, calls := counter(lastErr)
	done := runDo(ctx, fast(clock), fn)

	timer := <-clock.timers // Do is now sleeping on a timer that never fires
	cancel()
	err := result(t, done)

	require.Equal(t, 1, calls())
	require.True(t, timer.Stopped())
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, lastErr)
	require.NotErrorIs(t, err, retry.ErrExhausted)
	require.False(t, retry.IsRetryable(err))
	require.Equal(t, "retry: stopped after 1 attempts: context canceled; last error: update: (HostUnreachable) connection reset", err.Error())
}

func TestDoCancelCause(t *testing.T) {
	t.Parallel()
	clock := newBlockingClock()
	errShutdown := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	fn, calls := counter(errConflict)
	done := runDo(ctx, fast(clock), fn)
	<-clock.timers
	cancel(errShutdown)
	err := result(t, done)
	require.Equal(t, 1, calls())
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, errShutdown)
	require.ErrorIs(t, err, errConflict)
}

func TestDoContextEndsDuringAttempt(t *testing.T) {
	t.Parallel()

	// The caller's deadline passes while fn runs, and fn reports it: not retried.
	ctx := newManualCtx()
	calls := 0
	err := retry.Do(ctx, fast(newFakeClock()), func(context.Context) error {
		calls++
		ctx.End(context.DeadlineExceeded)
		return fmt.Errorf("find: %w", context.DeadlineExceeded)
	})
	require.Equal(t, 1, calls)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, "find: context deadline exceeded", err.Error()) // as is

	// The context ends while fn fails with a retryable error: both are wrapped.
	ctx = newManualCtx()
	calls = 0
	err = retry.Do(ctx, fast(newFakeClock()), func(context.Context) error {
		calls++
		ctx.End(context.DeadlineExceeded)
		return errConflict
	})
	require.Equal(t, 1, calls)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, errConflict)

	// The context ends in OnRetry, before the sleep: fn is not called again.
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := fast(newFakeClock())
	p.OnRetry = func(retry.Attempt) { cancel() }
	fn, n := counter(errConflict)
	err = retry.Do(cctx, p, fn)
	require.Equal(t, 1, n())
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, errConflict)
}

func TestDoContextDoneBeforeStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fn, calls := counter(nil)
	err := retry.Do(ctx, retry.Policy{Clock: newFakeClock()}, fn)
	require.Zero(t, calls())
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, "retry: stopped after 0 attempts: context canceled", err.Error())
}

func TestDoRealClock(t *testing.T) {
	t.Parallel()

	// 1ns delays on the real clock: no noticeable sleep.
	p := retry.Policy{InitialInterval: 1, MaxInterval: 1, MaxAttempts: 4}
	fn, calls := counter(errNetwork)
	err := retry.Do(context.Background(), p, fn)
	require.Equal(t, 4, calls())
	require.ErrorIs(t, err, retry.ErrExhausted)

	// A one-hour real sleep is cut short by cancellation.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p = retry.Policy{InitialInterval: time.Hour, Jitter: retry.NoJitter, MaxElapsedTime: -1}
	p.OnRetry = func(retry.Attempt) { go cancel() }
	netErr := fmt.Errorf("dial: %w", errNetwork)
	fn, calls = counter(netErr)
	err = result(t, runDo(ctx, p, fn))
	require.Equal(t, 1, calls())
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, netErr)
}

func TestDoValue(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	calls := 0
	v, err := retry.DoValue(context.Background(), fast(clock), func(context.Context) (string, error) {
		calls++
		if calls < 3 {
			return "partial", errConflict
		}
		return "done", nil
	})
	require.NoError(t, err)
	require.Equal(t, "done", v)
	require.Equal(t, 3, calls)

	p := fast(clock)
	p.MaxAttempts = 2
	n, err := retry.DoValue(context.Background(), p, func(context.Context) (int, error) {
		return 42, errConflict
	})
	require.ErrorIs(t, err, retry.ErrExhausted)
	require.Zero(t, n)
}

func TestDoNestedDoesNotMultiply(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	inner := fast(clock)
	inner.MaxAttempts = 3
	outer := inner
	fn, calls := counter(errNetwork)
	err := retry.Do(context.Background(), outer, func(ctx context.Context) error {
		return retry.Do(ctx, inner, fn)
	})
	require.Equal(t, 3, calls()) // not 9
	require.ErrorIs(t, err, retry.ErrExhausted)
}

func TestDoPassesContext(t *testing.T) {
	t.Parallel()
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "v")
	err := retry.Do(ctx, retry.Policy{}, func(got context.Context) error {
		require.Equal(t, "v", got.Value(key{}))
		return nil
	})
	require.NoError(t, err)
}

// The doc promises that a call that succeeds at once allocates nothing.
func TestDoFirstTrySuccessDoesNotAllocate(t *testing.T) {
	ctx := context.Background()
	p := retry.Default()
	ok := func(context.Context) error { return nil }
	require.Zero(t, testing.AllocsPerRun(200, func() { _ = retry.Do(ctx, p, ok) }))
	okValue := func(context.Context) (int, error) { return 1, nil }
	require.Zero(t, testing.AllocsPerRun(200, func() { _, _ = retry.DoValue(ctx, p, okValue) }))
}

func TestDoImmediately(t *testing.T) {
	t.Parallel()
	require.NoError(t, retry.Immediately(nil))

	// No sleep after an Immediately, and the backoff sequence does not
	// advance: the next retry waits the first delay.
	clock := newFakeClock()
	p := fast(clock)
	var got []retry.Attempt
	p.OnRetry = func(a retry.Attempt) { got = append(got, a) }
	err1, err2, err3 := fmt.Errorf("1: %w", errConflict), fmt.Errorf("2: %w", errConflict), fmt.Errorf("3: %w", errConflict)
	fn, calls := counter(retry.Immediately(err1), err2, retry.Immediately(err3), nil)
	require.NoError(t, retry.Do(context.Background(), p, fn))
	require.Equal(t, 4, calls())
	require.Equal(t, []time.Duration{10 * ms}, clock.Sleeps())
	require.Equal(t, []retry.Attempt{
		{Number: 1, Err: err1, Delay: 0, Elapsed: 0},
		{Number: 2, Err: err2, Delay: 10 * ms, Elapsed: 0},
		{Number: 3, Err: err3, Delay: 0, Elapsed: 10 * ms},
	}, got)

	// It takes a budget token like any retry, and what Do returns holds the
	// error, not the wrapper.
	clock = newFakeClock()
	p = fast(clock)
	p.Budget = retry.NewBudget(1, 1)
	fn, calls = counter(retry.Immediately(err1), retry.Immediately(err2), nil)
	err := retry.Do(context.Background(), p, fn)
	require.Equal(t, 2, calls())
	var be *retry.BudgetExhaustedError
	require.ErrorAs(t, err, &be)
	require.Same(t, err2, be.Last)
	require.Empty(t, clock.Sleeps())

	// MaxAttempts counts it.
	p = fast(newFakeClock())
	p.MaxAttempts = 2
	fn, calls = counter(retry.Immediately(err1), retry.Immediately(err2), nil)
	err = retry.Do(context.Background(), p, fn)
	require.Equal(t, 2, calls())
	var ex *retry.ExhaustedError
	require.ErrorAs(t, err, &ex)
	require.Same(t, err2, ex.Last)

	// A non-retryable error stays one, and comes back as is, whatever
	// wrappers of this package hold it.
	for _, e := range []error{retry.Immediately(errBoom), retry.Permanent(retry.Immediately(errConflict)), retry.Immediately(retry.Permanent(errConflict))} {
		fn, calls = counter(e, nil)
		err = retry.Do(context.Background(), fast(newFakeClock()), fn)
		require.Equal(t, 1, calls())
		require.NotContains(t, chainTypes(err), "*retry.immediateError")
		require.NotContains(t, chainTypes(err), "*retry.permanentError")
	}
	fn, _ = counter(retry.Immediately(retry.Immediately(err1)), err2, nil)
	got = nil
	p = fast(newFakeClock())
	p.OnRetry = func(a retry.Attempt) { got = append(got, a) }
	require.NoError(t, retry.Do(context.Background(), p, fn))
	require.Same(t, err1, got[0].Err)
	require.Equal(t, time.Duration(0), got[0].Delay)

	// The Observer sees the retry, with Delay 0.
	var delays []time.Duration
	p = fast(newFakeClock())
	p.Observer = observerFunc(func(_ context.Context, e observe.Event) {
		if e.Kind == observe.Retry {
			delays = append(delays, e.Delay)
		}
	})
	fn, _ = counter(retry.Immediately(err1), err2, nil)
	require.NoError(t, retry.Do(context.Background(), p, fn))
	require.Equal(t, []time.Duration{0, 10 * ms}, delays)

	// A context that ends during the attempt stops Do; the error holds fn's
	// error and the context's, not the wrapper.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls2 := 0
	err = retry.Do(ctx, fast(newFakeClock()), func(context.Context) error {
		calls2++
		cancel()
		return retry.Immediately(err1)
	})
	require.Equal(t, 1, calls2)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, errConflict)
	require.NotContains(t, chainTypes(err), "*retry.immediateError")
}

// chainTypes lists the types of err and of every error it wraps.
func chainTypes(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		out = append(out, fmt.Sprintf("%T", e))
		switch u := e.(type) { //nolint:errorlint // walks the chain by hand
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return out
}

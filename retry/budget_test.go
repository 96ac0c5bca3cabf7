package retry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/retry"
)

// storm runs one Do whose fn always fails with a retryable error, with
// unlimited attempts, so that only the budget stops it. It returns the number
// of calls of fn and Do's error.
func storm(t *testing.T, p retry.Policy) (int, error) {
	t.Helper()
	p.MaxAttempts, p.MaxElapsedTime = -1, -1
	fn, calls := counter(errConflict)
	err := retry.Do(context.Background(), p, fn)
	return calls(), err
}

func requireBudgetExhausted(t *testing.T, err error, attempts int) {
	t.Helper()
	require.ErrorIs(t, err, retry.ErrBudgetExhausted)
	require.ErrorIs(t, err, errConflict)
	require.NotErrorIs(t, err, retry.ErrExhausted)
	var be *retry.BudgetExhaustedError
	require.ErrorAs(t, err, &be)
	require.Equal(t, attempts, be.Attempts)
	require.Same(t, errConflict, be.Last)
}

func TestBudgetStopsStorm(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	p := fast(clock)
	p.Budget = retry.NewBudget(0, 3)
	retries := 0
	p.OnRetry = func(retry.Attempt) { retries++ }

	calls, err := storm(t, p)
	require.Equal(t, 4, calls) // the first attempt and exactly 3 retries
	require.Equal(t, 3, retries)
	requireBudgetExhausted(t, err, 4)

	// The budget is shared: the next call gets no retry at all, however much
	// time passes (no refill).
	clock.Advance(time.Hour)
	calls, err = storm(t, p)
	require.Equal(t, 1, calls)
	require.Equal(t, 3, retries)
	requireBudgetExhausted(t, err, 1)

	// A call that succeeds at once needs no token.
	fn, n := counter(nil)
	require.NoError(t, retry.Do(context.Background(), p, fn))
	require.Equal(t, 1, n())

	// Non-retryable errors take no token either.
	fn, n = counter(errBoom)
	require.Equal(t, errBoom, retry.Do(context.Background(), p, fn))
	require.Equal(t, 1, n())
}

func TestBudgetZeroBurst(t *testing.T) {
	t.Parallel()
	p := fast(newFakeClock())
	p.Budget = retry.NewBudget(100, 0)
	calls, err := storm(t, p)
	require.Equal(t, 1, calls)
	requireBudgetExhausted(t, err, 1)
}

func TestBudgetRefillOnOwnClock(t *testing.T) {
	t.Parallel()
	budgetClock := newFakeClock()
	// Do's sleeps move the Policy's clock, not the budget's. A token per 100ms.
	p := fast(newFakeClock())
	p.Budget = retry.NewBudget(10, 2, retry.WithBudgetClock(budgetClock))

	retriesAfter := func(d time.Duration) int {
		t.Helper()
		budgetClock.Advance(d)
		calls, err := storm(t, p)
		requireBudgetExhausted(t, err, calls)
		return calls - 1
	}
	require.Equal(t, 2, retriesAfter(0)) // starts full
	require.Equal(t, 0, retriesAfter(99*ms))
	require.Equal(t, 1, retriesAfter(1*ms)) // 100ms have passed since it emptied
	require.Equal(t, 0, retriesAfter(50*ms))
	require.Equal(t, 1, retriesAfter(50*ms)) // fractions add up
	require.Equal(t, 1, retriesAfter(150*ms))
	require.Equal(t, 1, retriesAfter(50*ms))     // the 50ms left over above count
	require.Equal(t, 2, retriesAfter(time.Hour)) // capped at burst
	require.Equal(t, 2, retriesAfter(250*ms))    // 2.5 tokens, capped at 2
	require.Equal(t, 0, retriesAfter(50*ms))     // time earned while full is lost
	budgetClock.Advance(-time.Minute)            // a clock that goes back refills nothing
	require.Equal(t, 0, retriesAfter(0))
	// and earns nothing until it passes the latest time the Budget counted:
	// counting from the earlier time would count that minute twice.
	// 50ms were earned before the step back; 50ms more past the mark make a
	// token.
	require.Equal(t, 0, retriesAfter(time.Minute+49*ms))
	require.Equal(t, 1, retriesAfter(ms))
}

func TestBudgetRefillOnPolicyClock(t *testing.T) {
	t.Parallel()
	// One token per 100ms, burst 1; Do's own sleeps move the clock.
	clock := newFakeClock()
	p := retry.Policy{
		InitialInterval: 100 * ms, MaxInterval: 100 * ms, Jitter: retry.NoJitter,
		MaxAttempts: 5, Clock: clock, Budget: retry.NewBudget(10, 1),
	}
	fn, calls := counter(errConflict)
	err := retry.Do(context.Background(), p, fn)
	require.ErrorIs(t, err, retry.ErrExhausted) // each 100ms sleep earned the next token
	require.Equal(t, 5, calls())

	// With 50ms sleeps the second retry finds the bucket empty.
	clock.Advance(time.Hour)
	p.InitialInterval, p.MaxInterval = 50*ms, 50*ms
	fn, calls = counter(errConflict)
	err = retry.Do(context.Background(), p, fn)
	requireBudgetExhausted(t, err, 2)
	require.Equal(t, 2, calls())
}

// syncRand is a concurrency-safe Rand for tests that share a Policy.
func syncRand() func() float64 {
	var mu sync.Mutex
	r := seqRand(0.3, 0.7, 0.1)
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r()
	}
}

func TestBudgetConcurrent(t *testing.T) {
	t.Parallel()
	const (
		goroutines = 16
		burst      = 200
	)
	var calls, retries atomic.Int64
	p := retry.Policy{
		InitialInterval: ms,
		MaxAttempts:     -1,
		MaxElapsedTime:  -1,
		Clock:           newFakeClock(),
		Rand:            syncRand(),
		Budget:          retry.NewBudget(0, burst),
		OnRetry:         func(retry.Attempt) { retries.Add(1) },
	}
	errs := make([]error, goroutines)
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Go(func() {
			errs[i] = retry.Do(context.Background(), p, func(context.Context) error {
				calls.Add(1)
				return fmt.Errorf("goroutine %d: %w", i, errConflict)
			})
		})
	}
	wg.Wait()
	// Every token was taken exactly once, and no retry went without one.
	require.Equal(t, int64(burst), retries.Load())
	require.Equal(t, int64(goroutines+burst), calls.Load())
	for _, err := range errs {
		require.ErrorIs(t, err, retry.ErrBudgetExhausted)
	}
}

func TestBudgetConcurrentRefill(t *testing.T) {
	t.Parallel()
	// Goroutines storm while the budget's clock moves 1s at a time: the
	// retries equal the burst plus the tokens earned, exactly.
	const (
		goroutines = 8
		burst      = 5
		perSecond  = 3
		seconds    = 20
	)
	budgetClock := newFakeClock()
	var retries atomic.Int64
	p := retry.Policy{
		InitialInterval: ms,
		MaxAttempts:     -1,
		MaxElapsedTime:  -1,
		Clock:           newFakeClock(),
		Rand:            syncRand(),
		Budget:          retry.NewBudget(perSecond, burst, retry.WithBudgetClock(budgetClock)),
		OnRetry:         func(retry.Attempt) { retries.Add(1) },
	}
	for range seconds {
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				err := retry.Do(context.Background(), p, func(context.Context) error { return errNetwork })
				if !errors.Is(err, retry.ErrBudgetExhausted) {
					t.Errorf("got %v, want ErrBudgetExhausted", err)
				}
			})
		}
		wg.Wait()
		budgetClock.Advance(time.Second) // the bucket is empty: exactly 3 tokens earned
	}
	require.Equal(t, int64(burst+perSecond*(seconds-1)), retries.Load())
}

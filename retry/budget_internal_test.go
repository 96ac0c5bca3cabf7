package retry

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/store"
)

// Goroutines read a shared clock and then race for the Budget's lock, so the
// readings reach refill out of order all the time. Time counted is never
// counted again, and the bucket never fills (its burst is far above what the
// run can earn), so the tokens granted, once the Budget is drained at the
// latest time read, are exactly the whole milliseconds that passed.
func TestBudgetExactUnderReorderedReadings(t *testing.T) {
	t.Parallel()
	const (
		goroutines = 8
		step       = 7 * time.Microsecond
		run        = 2 * time.Second // of the shared clock
	)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) store.Clock { return atClock(t0.Add(d)) }
	b := NewBudget(1000, 1<<30) // one token per ms
	b.mu.Lock()
	b.tokens = 0 // start empty at t0
	b.mu.Unlock()
	require.False(t, b.take(at(0)))

	var clock atomic.Int64 // the shared clock, in ns since t0
	var granted atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for {
				now := time.Duration(clock.Add(int64(step)))
				if now > run {
					return
				}
				if b.take(at(now)) {
					granted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	last := time.Duration(clock.Load())
	for b.take(at(last)) {
		granted.Add(1)
	}
	require.Equal(t, int64(last/time.Millisecond), granted.Load(),
		"tokens granted over %v of clock at 1000/s", last)
}

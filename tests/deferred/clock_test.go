package deferred_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/store"
)

// manualClock is a store.Clock that moves only when Advance is called: its
// timers fire then.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

type manualTimer struct {
	clock   *manualClock
	c       chan time.Time
	at      time.Time
	stopped bool
}

func (t *manualTimer) C() <-chan time.Time { return t.c }

func (t *manualTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

func newManualClock() *manualClock { return &manualClock{now: time.Unix(1_800_000_000, 0)} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) NewTimer(d time.Duration) store.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{clock: c, c: make(chan time.Time, 1), at: c.now.Add(d)}
	c.timers = append(c.timers, t)
	return t
}

// waiting reports how many timers wait to fire.
func (c *manualClock) waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Advance moves the clock by d and fires the timers due by then.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.stopped || !t.at.After(c.now) {
			if !t.stopped {
				t.stopped = true
				t.c <- c.now
			}
			continue
		}
		kept = append(kept, t)
	}
	c.timers = kept
}

// TestWaitPollsOnTheQueuesLocalClock: Options.LocalClock is the queue's
// one local time seam. Wait polling a job every hour, on a manual clock,
// sees the job finished as soon as the clock is moved an hour, with no
// hour of wall-clock time.
func TestWaitPollsOnTheQueuesLocalClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	clock := newManualClock()
	q := b.queue(t, nil, &deferred.Options{LocalClock: clock})
	k, err := deferred.Register(q, "j", func(context.Context, *deferred.Job, int) error { return nil })
	require.NoError(t, err)
	id := enqueue(t, b.ctx, k, "x", 1)
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	done := make(chan *deferred.Job, 1)
	go func() {
		j, err := q.Wait(ctx, id, time.Hour)
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		done <- j
	}()
	waitFor(t, 10*time.Second, "Wait to sleep on the queue's clock", func() bool { return clock.waiting() > 0 })
	require.NoError(t, q.Cancel(b.ctx, id))
	for {
		clock.Advance(time.Hour)
		select {
		case j := <-done:
			require.NotNil(t, j)
			require.Equal(t, deferred.StateCancelled, j.State)
			return
		case <-time.After(50 * time.Millisecond):
		}
		require.NoError(t, ctx.Err(), "Wait slept on the wall clock")
	}
}

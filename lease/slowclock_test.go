package lease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// TestSlowHelloNoSecondHolder: after the first reading of the server's
// clock, every hello round trip takes ten times as long (a loaded server, a
// farther node). Over ten minutes of simulated time (a local clock the test
// moves forward, with the server's clock moved alike) a holder renews and a
// contender keeps trying: the contender never holds the lease while the
// holder does, and in ModeEstimated the clock never hands out a zero
// estimate (an error matching store.ErrNoServerTime instead).
func TestSlowHelloNoSecondHolder(t *testing.T) { eachMode(t, testSlowHelloNoSecondHolder) }

//nolint:thelper // the body of a test, run once per mode
func testSlowHelloNoSecondHolder(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	sc := &slowableClock{}
	hello := store.HelloSampler(b.db.Client())
	var rtt0 atomic.Int64
	sample := func(ctx context.Context) (time.Time, error) {
		start := time.Now()
		if d := rtt0.Load(); d > 0 {
			time.Sleep(time.Duration(9 * d)) // 10x the first round trip
		}
		st, err := hello(ctx)
		if rtt0.Load() == 0 {
			rtt0.Store(max(int64(time.Since(start)), int64(time.Millisecond)))
		}
		return st.Add(sc.skipped()), err
	}
	clock := store.NewClock(sample, &store.ClockOptions{Now: sc.now})
	const ttl = time.Minute
	a := b.manager(t, "a", ttl, &lease.Options{Clock: clock, Now: sc.now})
	c := b.manager(t, "c", ttl, &lease.Options{Clock: clock, Now: sc.now})

	var la *lease.Lease
	held := 0
	for step := range 60 { // 60 steps of 10s: 10 minutes
		if mode == lease.ModeEstimated {
			est, err := clock.Now(ctx)
			if err != nil {
				require.ErrorIs(t, err, store.ErrNoServerTime, "step %d", step)
			} else {
				require.False(t, est.Time.IsZero(), "step %d: a zero estimate", step)
			}
		}
		if la == nil || la.Err() != nil {
			if l, err := a.TryAcquire(ctx, id); err == nil {
				la = l
			}
		} else {
			_ = la.Renew(ctx)
		}
		if la != nil && la.Err() == nil && la.TimeLeft() > 0 {
			held++
		}
		lc, err := c.TryAcquire(ctx, id)
		if err == nil {
			require.True(t, la == nil || la.Err() != nil || la.TimeLeft() == 0,
				"step %d: two holders: a (epoch %d, %v left) and c (epoch %d)", step, la.Epoch(), la.TimeLeft(), lc.Epoch())
			require.NoError(t, lc.Release(ctx))
		}
		sc.pass(10 * time.Second)
	}
	t.Logf("a held the lease at %d of 60 steps", held)
	require.Positive(t, held)
	if la != nil {
		_ = la.Release(ctx)
	}
}

// TestAcquireSettlesUnknownClaim: a claim is applied but its reply is lost
// and the re-read fails too (ErrUnknownOutcome). Acquire's next attempt
// finds its own claim in the record and holds the lease at once, instead of
// waiting out a lease it holds itself.
func TestAcquireSettlesUnknownClaim(t *testing.T) { eachMode(t, testAcquireSettlesUnknownClaim) }

//nolint:thelper // the body of a test, run once per mode
func testAcquireSettlesUnknownClaim(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	f := b.db.Faulty(t, nil)
	var healed atomic.Bool
	unknowns := 0
	fault := f.DropNextReply(mongotest.Commands([]string{"findAndModify"}, b.coll.Name()))
	reads := mongotest.Commands([]string{"find", "aggregate"}, b.coll.Name())
	f.DropReplies(1000, func(c *mongotest.Command) bool { return !healed.Load() && reads(c) })
	policy := fastRetry
	policy.OnRetry = func(at retry.Attempt) {
		if errors.Is(at.Err, lease.ErrUnknownOutcome) {
			unknowns++
		}
		healed.Store(true)
	}
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", time.Hour, &lease.Options{
		ResolveTimeout: 300 * time.Millisecond,
		Retry:          policy,
	})
	actx, cancel := context.WithTimeout(ctx, 30*time.Second) // far below the TTL
	defer cancel()
	l, err := a.Acquire(actx, id)
	require.True(t, fault.HasFired())
	require.NoError(t, err, "Acquire settled its own claim")
	require.Equal(t, 1, unknowns, "the first attempt's outcome was unknown")
	d := load(t, b.coll, id)
	require.Equal(t, d.Lease.Epoch, l.Epoch(), "the claim applied is the lease's")
	require.Equal(t, "a", owner(d.Lease))
	require.NoError(t, l.Release(ctx))
}

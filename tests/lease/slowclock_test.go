package lease_test

import (
	"context"
	"errors"
	"slices"
	"sync"
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
	measured := func(ctx context.Context) (time.Time, error) {
		start := time.Now()
		st, err := hello(ctx)
		if rtt0.Load() == 0 {
			rtt0.Store(max(int64(time.Since(start)), int64(time.Millisecond)))
		}
		return st, err
	}
	// After the first reading, 10x its round trip: 9x slept plus the trip.
	sample := sc.sampler(measured, func() time.Duration { return time.Duration(9 * rtt0.Load()) })
	clock := store.NewServerClock(sample, &store.ServerClockOptions{Now: sc.now})
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

// TestSlowHelloProxyNoSecondHolder: the holder's Manager reads the server's
// clock through a fault proxy which, after the first reading, holds every
// hello reply for nine times that reading's round trip (at least 20ms): each
// later reading takes ten times as long, as from a loaded server or a
// farther node. Over ten minutes of simulated time (a local clock the test
// moves forward, with the server's clock as read moved alike) the holder
// renews, stops renewing for a while (a crash) and takes the lease again,
// and a contender with a fast clock keeps trying: the contender never gets
// the lease while the holder's deadline has not passed, and the holder's
// clock never hands out a zero estimate (an error matching
// store.ErrNoServerTime instead).
func TestSlowHelloProxyNoSecondHolder(t *testing.T) {
	eachMode(t, testSlowHelloProxyNoSecondHolder)
}

//nolint:thelper // the body of a test, run once per mode
func testSlowHelloProxyNoSecondHolder(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	f := b.db.Faulty(t, nil)
	sc := &slowableClock{}

	// a's clock: hello through the proxy, each round trip noted.
	var (
		mu      sync.Mutex
		rtts    []time.Duration
		delayed bool
		slow    []time.Duration // round trips of readings sent after the delay was armed
	)
	viaProxy := store.HelloSampler(f.Client)
	clock := store.NewServerClock(sc.sampler(func(ctx context.Context) (time.Time, error) {
		mu.Lock()
		armed := delayed
		mu.Unlock()
		start := time.Now()
		st, err := viaProxy(ctx)
		rtt := time.Since(start)
		mu.Lock()
		rtts = append(rtts, rtt)
		if armed {
			slow = append(slow, rtt)
		}
		mu.Unlock()
		return st, err
	}, nil), &store.ServerClockOptions{Now: sc.now})
	require.NoError(t, clock.Sync(ctx), "the first reading")
	mu.Lock()
	rtt0 := slices.Min(rtts)
	delay := max(9*rtt0, 20*time.Millisecond)
	delayed = true
	mu.Unlock()
	stop := f.DelayReplies(delay, mongotest.Commands([]string{"hello"}))
	defer stop()
	t.Logf("first hello round trip %v; later ones held %v more by the proxy", rtt0, delay)

	// c's clock: hello straight to the server, on the same simulated time.
	direct := store.HelloSampler(b.db.Client())
	cClock := store.NewServerClock(sc.sampler(direct, nil), &store.ServerClockOptions{Now: sc.now})

	const ttl = time.Minute
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", ttl, &lease.Options{Clock: clock, Now: sc.now})
	c := b.manager(t, "c", ttl, &lease.Options{Clock: cClock, Now: sc.now})
	live := func(l *lease.Lease) bool { return l != nil && l.Err() == nil && l.TimeLeft() > 0 }

	var la *lease.Lease
	held, taken, estimates := 0, 0, 0
	for step := range 60 { // 60 steps of 10s: 10 minutes
		est, err := clock.Now(ctx)
		if err != nil {
			require.ErrorIs(t, err, store.ErrNoServerTime, "step %d", step)
		} else {
			require.False(t, est.Time.IsZero(), "step %d: a zero estimate", step)
			require.GreaterOrEqual(t, est.Bound, time.Duration(0), "step %d", step)
			estimates++
		}
		crashed := step >= 20 && step < 30 // a neither renews nor claims
		if !crashed {
			if la != nil && la.Err() == nil {
				_ = la.Renew(ctx) // ends la if its deadline passed
			}
			if la == nil || la.Err() != nil {
				if l, err := a.TryAcquire(ctx, id); err == nil {
					la = l
				}
			}
		}
		if live(la) {
			held++
		}
		lc, err := c.TryAcquire(ctx, id)
		if err == nil {
			taken++
			require.False(t, live(la), "step %d: two holders: a (epoch %d, %v left) and c (epoch %d)",
				step, la.Epoch(), la.TimeLeft(), lc.Epoch())
			require.NoError(t, lc.Release(ctx))
		} else {
			require.ErrorIs(t, err, lease.ErrHeld, "step %d", step)
		}
		sc.pass(10 * time.Second)
	}
	mu.Lock()
	n, slowest := len(slow), slices.Max(append(slow, 0))
	fastest := slices.Min(append(slow, time.Hour))
	mu.Unlock()
	t.Logf("a held the lease at %d of 60 steps, c took it %d times; %d estimates; %d delayed readings, %v to %v",
		held, taken, estimates, n, fastest, slowest)
	require.GreaterOrEqual(t, n, 2, "readings were taken through the delay")
	require.GreaterOrEqual(t, fastest, delay, "every later reading was delayed")
	require.Positive(t, held)
	require.Positive(t, estimates)
	if mode == lease.ModeEstimated {
		// The server's clock as read moved on with the simulated time, so
		// the crash let c take the lease: the check above was not vacuous.
		// (In ModeServer the server's own clock judges, in real time.)
		require.Positive(t, taken, "c took the lease during a's crash")
	}
	if live(la) {
		require.NoError(t, la.Release(ctx))
	}
}

package lease_test

// The server's clock as a Manager estimates it (ModeEstimated, and the
// deadlines of both modes): a slow or stale reading never yields a second
// holder, nor a deadline beyond the TTL.
//
// A lease claimed or renewed while store.ServerClock's kept reading is past MaxAge
// and fresh readings have a larger round trip (the clock once handed out a
// zero Estimate with a nil error then; see the store package's clock tests).
// With a zero estimate:
//
// Claim: expiresAt would be written as 0001-01-01 + TTL, so every other
// owner would see the lease as expired at once and take it, while the first
// holder's local deadline is TTL - margin away: two holders.
//
// Renew: the renewal would write lastSent+1ms (the record barely moves) but
// the holder's local deadline would become t0 + (expires - 0001-01-01),
// about two thousand years: the holder would never expire locally while
// others take over after TTL.

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
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

func TestClaimWithSlowClockHasOneHolder(t *testing.T) {
	eachMode(t, testClaimWithSlowClockHasOneHolder)
}

//nolint:thelper // the body of a test, run once per mode
func testClaimWithSlowClockHasOneHolder(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)

	sc := &slowableClock{}
	hello := store.HelloSampler(b.db.Client())
	sample := sc.sampler(hello, sc.whenSlow(100*time.Millisecond)) // the server's clock moves on with ours
	// Default ClockOptions (ResyncInterval 30s, MaxAge 5m), local Now that
	// the test moves forward.
	clockA := store.NewServerClock(sample, &store.ServerClockOptions{Now: sc.now})
	a, err := lease.New(b.coll, &lease.Options{TTL: 30 * time.Second, Owner: "a", Clock: clockA, Now: sc.now, Mode: mode})
	require.NoError(t, err)

	_, err = clockA.Now(ctx) // a first, fast reading
	require.NoError(t, err)

	// Six minutes pass; hello now takes 100ms.
	sc.pass(6 * time.Minute)
	sc.slow.Store(true)

	la, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)
	t.Logf("a holds epoch %d, server expiry written %v, a's time left %v", la.Epoch(), la.ExpiresAt(), la.TimeLeft())

	// c: an honest owner whose server-time reference is the same shifted one.
	clockC := store.NewServerClock(sc.sampler(hello, nil), &store.ServerClockOptions{Now: sc.now})
	c, err := lease.New(b.coll, &lease.Options{TTL: 30 * time.Second, Owner: "c", Clock: clockC, Now: sc.now, Mode: mode})
	require.NoError(t, err)
	lc, err := c.TryAcquire(ctx, id)
	if err == nil {
		t.Logf("c holds epoch %d", lc.Epoch())
		require.Error(t, la.Err(), "BUG: two holders: a (epoch %d, %v left, Err %v) and c (epoch %d)",
			la.Epoch(), la.TimeLeft(), la.Err(), lc.Epoch())
	}
	require.ErrorIs(t, err, lease.ErrHeld, "a holds the lease; c must get ErrHeld")
}

func TestRenewWithSlowClockKeepsDeadlineWithinTTL(t *testing.T) {
	eachMode(t, testRenewWithSlowClockKeepsDeadlineWithinTTL)
}

//nolint:thelper // the body of a test, run once per mode
func testRenewWithSlowClockKeepsDeadlineWithinTTL(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)

	// a's local time is a clock the test moves forward (with the server's
	// clock as a reads it), so that a loaded machine cannot make the
	// renewal below late.
	sc := &slowableClock{}
	hello := store.HelloSampler(b.db.Client())
	sample := sc.sampler(hello, sc.whenSlow(30*time.Millisecond))
	// Short ResyncInterval and MaxAge (valid options); with the defaults the
	// same happens after 5 minutes of round trips 60ms longer than the best
	// reading.
	clockA := store.NewServerClock(sample, &store.ServerClockOptions{ResyncInterval: 100 * time.Millisecond, MaxAge: 200 * time.Millisecond, Now: sc.now})
	const ttl = 2 * time.Second
	a, err := lease.New(b.coll, &lease.Options{TTL: ttl, Owner: "a", Clock: clockA, Now: sc.now, Mode: mode})
	require.NoError(t, err)
	la, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)
	t.Logf("a's deadline after the claim: in %v", la.Deadline().Sub(sc.now()))

	sc.pass(300 * time.Millisecond)
	sc.slow.Store(true)
	require.NoError(t, la.Renew(ctx))
	left := la.Deadline().Sub(sc.now())
	t.Logf("a's deadline after the renewal: in %v; record expiry %v", left, la.ExpiresAt())

	// c takes over once the record's expiry passes (it barely moved).
	c := b.manager(t, "c", ttl, &lease.Options{Retry: fastRetry})
	actx, cancel := context.WithTimeout(ctx, 3*ttl)
	defer cancel()
	lc, err := c.Acquire(actx, id)
	if err == nil {
		t.Logf("c holds epoch %d while a (epoch %d) has Err=%v and TimeLeft=%v", lc.Epoch(), la.Epoch(), la.Err(), la.TimeLeft())
	}
	require.Less(t, left, ttl, "BUG: a renewal moved the holder's local deadline %v ahead (TTL is %v)", left, ttl)
}

// slowableClock is a store.ServerClock over the real server's hello whose readings
// can be made to take an extra delay (a loaded server or a slow network), on
// a local clock that can be moved forward (time passing).
type slowableClock struct {
	mu   sync.Mutex
	skip time.Duration // added to time.Now: time that "passed"
	slow atomic.Bool
}

func (s *slowableClock) now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().Add(s.skip)
}

func (s *slowableClock) pass(d time.Duration) {
	s.mu.Lock()
	s.skip += d
	s.mu.Unlock()
}

func (s *slowableClock) skipped() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.skip
}

// sampler reads the server's clock with read and moves the reading on by the
// time the test made pass, as if the server's clock had run on with the local
// one. When delay is not nil and returns more than zero, it sleeps that long
// first: a slow network or a loaded server.
func (s *slowableClock) sampler(read store.Sampler, delay func() time.Duration) store.Sampler {
	return func(ctx context.Context) (time.Time, error) {
		if delay != nil {
			if d := delay(); d > 0 {
				time.Sleep(d)
			}
		}
		st, err := read(ctx)
		return st.Add(s.skipped()), err
	}
}

// whenSlow returns a delay of d while s is marked slow, and none otherwise.
func (s *slowableClock) whenSlow(d time.Duration) func() time.Duration {
	return func() time.Duration {
		if s.slow.Load() {
			return d
		}
		return 0
	}
}

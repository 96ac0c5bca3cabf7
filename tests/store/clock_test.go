package store_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

// fakeNet is a local clock and a server clock that a test moves by hand. A
// reading costs out latency before the server stamps its time and back
// latency after.
type fakeNet struct {
	mu        sync.Mutex
	local     time.Time
	offset    time.Duration // server = local + offset
	latencies [][2]time.Duration
	rest      [2]time.Duration // latency once latencies are used up; zero: 1ms each way
	calls     int
	fail      error
}

func (f *fakeNet) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.local
}

func (f *fakeNet) advance(d time.Duration) {
	f.mu.Lock()
	f.local = f.local.Add(d)
	f.mu.Unlock()
}

// advanceTo moves the local clock to t unless it is past t already.
func (f *fakeNet) advanceTo(t time.Time) {
	f.mu.Lock()
	if t.After(f.local) {
		f.local = t
	}
	f.mu.Unlock()
}

func (f *fakeNet) sampled() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *fakeNet) serverNow() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.local.Add(f.offset)
}

func (f *fakeNet) sample(context.Context) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fail != nil {
		return time.Time{}, f.fail
	}
	lat := [2]time.Duration{time.Millisecond, time.Millisecond}
	if f.rest != ([2]time.Duration{}) {
		lat = f.rest
	}
	if len(f.latencies) > 0 {
		lat, f.latencies = f.latencies[0], f.latencies[1:]
	}
	f.local = f.local.Add(lat[0])
	st := f.local.Add(f.offset).Truncate(time.Millisecond) // BSON dates have ms resolution
	f.local = f.local.Add(lat[1])
	return st, nil
}

func newFake(offset time.Duration) *fakeNet {
	return &fakeNet{local: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC), offset: offset}
}

func requireWithin(t *testing.T, e store.Estimate, truth time.Time) {
	t.Helper()
	require.False(t, truth.Before(e.Earliest()), "true server time %v before earliest %v (bound %v)", truth, e.Earliest(), e.Bound)
	require.False(t, truth.After(e.Latest()), "true server time %v after latest %v (bound %v)", truth, e.Latest(), e.Bound)
}

func TestClockKeepsSmallestRoundTrip(t *testing.T) {
	f := newFake(3 * time.Hour)
	f.latencies = [][2]time.Duration{
		{40 * time.Millisecond, 10 * time.Millisecond}, // rtt 50ms, asymmetric
		{2 * time.Millisecond, 2 * time.Millisecond},   // rtt 4ms: the one to keep
		{30 * time.Millisecond, 30 * time.Millisecond}, // rtt 60ms
	}
	c := store.NewServerClock(f.sample, &store.ServerClockOptions{Samples: 3, Now: f.now})
	e, err := c.Now(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, f.calls)
	require.Equal(t, 4*time.Millisecond, e.RTT)
	require.Equal(t, (4*time.Millisecond+time.Millisecond)/2+time.Duration(float64(e.Age)*1e-4), e.Bound)
	requireWithin(t, e, f.serverNow())
}

func TestClockEstimateTracksElapsedTimeAndBoundGrows(t *testing.T) {
	f := newFake(-90 * time.Second)
	c := store.NewServerClock(f.sample, &store.ServerClockOptions{Samples: 1, Now: f.now, ResyncInterval: time.Hour, MaxAge: 2 * time.Hour})
	e1, err := c.Now(context.Background())
	require.NoError(t, err)
	f.advance(20 * time.Minute)
	e2, err := c.Now(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, f.calls, "no resync before ResyncInterval")
	require.Equal(t, 20*time.Minute, e2.Time.Sub(e1.Time))
	require.Greater(t, e2.Bound, e1.Bound, "drift allowance grows with age")
	require.Equal(t, e1.Bound+time.Duration(float64(20*time.Minute)*1e-4), e2.Bound)
	requireWithin(t, e2, f.serverNow())
}

// The estimate uses differences of local readings only: a host whose wall
// clock is ten minutes off in either direction gets the same answer.
func TestClockIgnoresLocalWallClockSkew(t *testing.T) {
	for _, skew := range []time.Duration{-10 * time.Minute, 0, 10 * time.Minute} {
		f := newFake(0)
		f.offset = -skew // the server is right; the host is skewed by skew
		c := store.NewServerClock(f.sample, &store.ServerClockOptions{Samples: 2, Now: f.now})
		e, err := c.Now(context.Background())
		require.NoError(t, err)
		requireWithin(t, e, f.serverNow())
		require.Less(t, e.Bound, 5*time.Millisecond)
	}
}

func TestClockResyncsAfterInterval(t *testing.T) {
	f := newFake(time.Minute)
	c := store.NewServerClock(f.sample, &store.ServerClockOptions{Samples: 2, Now: f.now, ResyncInterval: 10 * time.Second})
	_, err := c.Now(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, f.calls)
	f.advance(11 * time.Second)
	e, err := c.Now(context.Background())
	require.NoError(t, err)
	require.Equal(t, 4, f.calls, "a reading older than ResyncInterval is refreshed")
	require.Less(t, e.Age, time.Second)
	requireWithin(t, e, f.serverNow())
}

func TestClockFallsBackToOldReadingWithinMaxAge(t *testing.T) {
	f := newFake(time.Minute)
	c := store.NewServerClock(f.sample, &store.ServerClockOptions{Samples: 1, Now: f.now, ResyncInterval: 10 * time.Second, MaxAge: time.Minute})
	_, err := c.Now(context.Background())
	require.NoError(t, err)

	f.fail = errors.New("server unreachable")
	f.advance(30 * time.Second)
	e, err := c.Now(context.Background())
	require.NoError(t, err, "the old reading is still usable")
	require.Equal(t, 30*time.Second, e.Age)
	requireWithin(t, e, f.serverNow())

	f.advance(31 * time.Second)
	_, err = c.Now(context.Background())
	require.ErrorIs(t, err, store.ErrNoServerTime)
	require.ErrorContains(t, err, "server unreachable")
}

func TestClockNeverSyncedFails(t *testing.T) {
	f := newFake(0)
	f.fail = errors.New("boom")
	c := store.NewServerClock(f.sample, &store.ServerClockOptions{Now: f.now})
	_, err := c.Now(context.Background())
	require.ErrorIs(t, err, store.ErrNoServerTime)
}

func TestClockConcurrentCallersShareOneSync(t *testing.T) {
	f := newFake(time.Second)
	c := store.NewServerClock(f.sample, &store.ServerClockOptions{Samples: 3, Now: f.now})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			_, err := c.Now(context.Background())
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, 3, f.calls, "one sync of three readings for all callers")
}

// On the real backend the estimate brackets the server's own localTime
// readings taken just before and after.
func TestClockOnServer(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	sample := store.HelloSampler(db.Client())
	c := store.NewServerClock(sample, nil)

	before, err := sample(ctx)
	require.NoError(t, err)
	e, err := c.Now(ctx)
	require.NoError(t, err)
	after, err := sample(ctx)
	require.NoError(t, err)

	t.Logf("server clock estimate: bound=%v rtt=%v", e.Bound, e.RTT)
	require.Less(t, e.Bound, 250*time.Millisecond)
	// localTime has millisecond resolution: allow one millisecond either way.
	require.False(t, e.Latest().Add(time.Millisecond).Before(before), "estimate %v earlier than an earlier reading %v", e.Latest(), before)
	require.False(t, e.Earliest().After(after.Add(time.Millisecond)), "estimate %v later than a later reading %v", e.Earliest(), after)
}

// The round trip grows tenfold after the first reading (a loaded server, a
// saturated pool, a farther node after failover) while Now is called every
// second from several goroutines for ten minutes of simulated time. Every
// answer is usable and brackets the server's time; a stale reading is replaced
// by the slower fresh ones, so a caller alone always gets a fresh reading; and
// the readings sent stay within Samples × (1 + ⌊T / ResyncInterval⌋).
func TestClockSlowerRoundTripsUnderLoad(t *testing.T) {
	t.Parallel()
	const (
		goroutines = 8
		seconds    = 600
		samples    = 3
		resync     = 30 * time.Second
		maxAge     = 5 * time.Minute
	)
	f := newFake(2 * time.Hour)
	f.latencies = [][2]time.Duration{{time.Millisecond, time.Millisecond}}
	f.rest = [2]time.Duration{10 * time.Millisecond, 10 * time.Millisecond}
	c := store.NewServerClock(f.sample, &store.ServerClockOptions{Samples: samples, ResyncInterval: resync, MaxAge: maxAge, Now: f.now})
	ctx := context.Background()
	start := f.now()

	var last store.Estimate
	for sec := range seconds {
		f.advanceTo(start.Add(time.Duration(sec) * time.Second))
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				// Other callers' readings move the local clock meanwhile: the
				// true time at which Now computed lies between these two.
				before := f.serverNow()
				e, err := c.Now(ctx)
				after := f.serverNow()
				if err != nil {
					t.Errorf("second %d: %v", sec, err)
					return
				}
				if e.Time.IsZero() || e.Age >= maxAge || e.Earliest().After(after) || e.Latest().Before(before) {
					t.Errorf("second %d: estimate %+v, true server time in [%v, %v]", sec, e, before, after)
				}
			})
		}
		wg.Wait()
		// Alone, the caller sees the exact instant Now computed at.
		e, err := c.Now(ctx)
		require.NoError(t, err)
		requireWithin(t, e, f.serverNow())
		require.Less(t, e.Age, resync, "second %d: a stale reading was not replaced", sec)
		last = e
	}
	require.Equal(t, 20*time.Millisecond, last.RTT, "the slower readings replaced the fast one")
	span := f.now().Sub(start)
	limit := samples * (1 + int(span/resync))
	t.Logf("%d readings over %v (limit %d)", f.sampled(), span, limit)
	require.LessOrEqual(t, f.sampled(), limit)
	// and at least one sync per ResyncInterval plus the one-second gap
	// between calls plus a sync's own time (under 100ms here).
	require.GreaterOrEqual(t, f.sampled(), samples*int(span/(resync+1100*time.Millisecond)))
}

// The reviewer's scenario, counted: once the slow readings replaced the stale
// fast one, calls within ResyncInterval send nothing (before the fix every
// call re-synced, because every new reading was thrown away).
func TestClockStaleReadingReplacedByOneSync(t *testing.T) {
	t.Parallel()
	f := newFake(0)
	c := store.NewServerClock(f.sample, &store.ServerClockOptions{Now: f.now})
	ctx := context.Background()
	_, err := c.Now(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, f.sampled())

	f.advance(6 * time.Minute)
	f.rest = [2]time.Duration{50 * time.Millisecond, 50 * time.Millisecond}
	for range 200 { // 20 s
		e, err := c.Now(ctx)
		require.NoError(t, err)
		requireWithin(t, e, f.serverNow())
		require.Equal(t, 100*time.Millisecond, e.RTT)
		f.advance(100 * time.Millisecond)
	}
	require.Equal(t, 6, f.sampled(), "one sync of three readings")
}

// A reading past MaxAge is never handed out, even when the sync that should
// have replaced it succeeded: here the host is suspended for two minutes
// between any two readings of its clock, so the new reading is already past
// MaxAge when Now would compute from it.
func TestClockNeverReturnsReadingPastMaxAge(t *testing.T) {
	t.Parallel()
	f := newFake(time.Hour)
	var suspended atomic.Bool
	now := func() time.Time {
		if suspended.Load() {
			f.advance(2 * time.Minute)
		}
		return f.now()
	}
	c := store.NewServerClock(f.sample, &store.ServerClockOptions{Samples: 1, ResyncInterval: time.Second, MaxAge: time.Minute, Now: now})
	ctx := context.Background()
	_, err := c.Now(ctx)
	require.NoError(t, err)

	suspended.Store(true)
	e, err := c.Now(ctx)
	require.ErrorIs(t, err, store.ErrNoServerTime)
	require.ErrorContains(t, err, "past MaxAge")
	require.Zero(t, e)
	require.Equal(t, 2, f.sampled())
}

// A Sampler that answers the zero time has not read the server's clock.
func TestClockRefusesZeroReading(t *testing.T) {
	t.Parallel()
	c := store.NewServerClock(func(context.Context) (time.Time, error) { return time.Time{}, nil }, nil)
	e, err := c.Now(context.Background())
	require.ErrorIs(t, err, store.ErrNoServerTime)
	require.Zero(t, e)
}

// A sync stops at the first failed reading and keeps the readings before it;
// the error of an ended context matches that context's error too.
func TestClockSyncStopsAtFirstFailure(t *testing.T) {
	t.Parallel()
	f := newFake(0)
	c := store.NewServerClock(f.sample, &store.ServerClockOptions{Samples: 5, Now: f.now})
	f.fail = errors.New("unreachable")
	_, err := c.Now(context.Background())
	require.ErrorIs(t, err, store.ErrNoServerTime)
	require.Equal(t, 1, f.sampled())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.Now(ctx)
	require.ErrorIs(t, err, store.ErrNoServerTime)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, f.sampled(), "nothing is sent on an ended context")

	//nolint:staticcheck // a nil ctx is the input under test
	_, err = c.Now(nil)
	require.ErrorIs(t, err, store.ErrInvalid)
}

// The same on the real backend, through the driver: after a first reading,
// the proxy holds every hello reply for nine more round trips, and ten
// minutes pass (a local clock that skips ahead one second per round of
// calls). Every answer is usable, the slow readings replace the stale fast
// one, and the hellos the command monitor sees stay within
// Samples × (1 + ⌊T / ResyncInterval⌋).
func TestClockSlowerHelloOnServer(t *testing.T) {
	db := mongotest.New(t)
	var hellos atomic.Int64
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "hello" {
			hellos.Add(1)
		}
	}}
	fy := db.Faulty(t, &mongotest.FaultyOptions{ClientOptions: options.Client().SetMonitor(mon)})
	var skipped atomic.Int64 // simulated time, added to both clocks
	now := func() time.Time { return time.Now().Add(time.Duration(skipped.Load())) }
	hello := store.HelloSampler(fy.Client)
	sample := func(ctx context.Context) (time.Time, error) {
		st, err := hello(ctx)
		return st.Add(time.Duration(skipped.Load())), err
	}
	const resync, maxAge = 30 * time.Second, 5 * time.Minute
	c := store.NewServerClock(sample, &store.ServerClockOptions{ResyncInterval: resync, MaxAge: maxAge, Now: now})
	ctx := context.Background()
	start := now()
	e, err := c.Now(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, hellos.Load())

	delay := max(9*e.RTT, 10*time.Millisecond)
	stop := fy.DelayReplies(delay, mongotest.Commands([]string{"hello"}))
	defer stop()
	for sec := range 600 {
		skipped.Add(int64(time.Second))
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				e, err := c.Now(ctx)
				if err != nil || e.Time.IsZero() || e.Age >= maxAge {
					t.Errorf("second %d: %+v, %v", sec, e, err)
				}
			})
		}
		wg.Wait()
		e, err = c.Now(ctx)
		require.NoError(t, err)
		require.Less(t, e.Age, resync, "second %d: a stale reading was not replaced", sec)
	}
	require.GreaterOrEqual(t, e.RTT, delay, "the slow readings replaced the fast one")
	span := now().Sub(start)
	limit := 3 * (1 + int64(span/resync))
	t.Logf("hello delayed %v: %d hellos over %v (limit %d), last rtt %v bound %v", delay, hellos.Load(), span, limit, e.RTT, e.Bound)
	require.LessOrEqual(t, hellos.Load(), limit)
}

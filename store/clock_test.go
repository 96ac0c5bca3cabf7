package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
	c := store.NewClock(f.sample, &store.ClockOptions{Samples: 3, Now: f.now})
	e, err := c.Now(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, f.calls)
	require.Equal(t, 4*time.Millisecond, e.RTT)
	require.Equal(t, (4*time.Millisecond+time.Millisecond)/2+time.Duration(float64(e.Age)*1e-4), e.Bound)
	requireWithin(t, e, f.serverNow())
}

func TestClockEstimateTracksElapsedTimeAndBoundGrows(t *testing.T) {
	f := newFake(-90 * time.Second)
	c := store.NewClock(f.sample, &store.ClockOptions{Samples: 1, Now: f.now, ResyncInterval: time.Hour, MaxAge: 2 * time.Hour})
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
		c := store.NewClock(f.sample, &store.ClockOptions{Samples: 2, Now: f.now})
		e, err := c.Now(context.Background())
		require.NoError(t, err)
		requireWithin(t, e, f.serverNow())
		require.Less(t, e.Bound, 5*time.Millisecond)
	}
}

func TestClockResyncsAfterInterval(t *testing.T) {
	f := newFake(time.Minute)
	c := store.NewClock(f.sample, &store.ClockOptions{Samples: 2, Now: f.now, ResyncInterval: 10 * time.Second})
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
	c := store.NewClock(f.sample, &store.ClockOptions{Samples: 1, Now: f.now, ResyncInterval: 10 * time.Second, MaxAge: time.Minute})
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
	c := store.NewClock(f.sample, &store.ClockOptions{Now: f.now})
	_, err := c.Now(context.Background())
	require.ErrorIs(t, err, store.ErrNoServerTime)
}

func TestClockConcurrentCallersShareOneSync(t *testing.T) {
	f := newFake(time.Second)
	c := store.NewClock(f.sample, &store.ClockOptions{Samples: 3, Now: f.now})
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
	c := store.NewClock(sample, nil)

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

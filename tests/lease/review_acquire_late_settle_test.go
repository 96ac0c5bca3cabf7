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
)

// TestAcquireClaimsAgainAfterLateSettle (review, item 4): Acquire's claim is
// applied but its outcome is unknown (reply lost, re-read failed). Before the
// next attempt the local clock (Options.Now, moved by the test) passes that
// claim's deadline, while the server has not expired it (TTL one hour of
// real time). The next attempt finds its own claim, too old to use: Acquire
// releases it and claims again, and returns a live lease with a later epoch,
// instead of a *LostError.
func TestAcquireClaimsAgainAfterLateSettle(t *testing.T) {
	eachMode(t, testAcquireClaimsAgainAfterLateSettle)
}

//nolint:thelper // the body of a test, run once per mode
func testAcquireClaimsAgainAfterLateSettle(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	f := b.db.Faulty(t, nil)
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	const ttl = time.Hour
	var (
		healed   atomic.Bool
		unknowns atomic.Int32
		losts    atomic.Int32
	)
	policy := fastRetry
	policy.OnRetry = func(at retry.Attempt) {
		switch {
		case errors.Is(at.Err, lease.ErrUnknownOutcome):
			unknowns.Add(1)
			skew.Add(int64(2 * ttl)) // the unknown claim's deadline passes
		case errors.Is(at.Err, lease.ErrLost):
			losts.Add(1)
		}
		healed.Store(true)
	}
	a, id, first := primed(t, b, f, &lease.Options{
		TTL:            ttl,
		ResolveTimeout: 300 * time.Millisecond,
		Retry:          policy,
		Now:            now,
		Clock:          b.clock, // the server's clock estimate stays on real time
	})

	fault := f.DropNextReply(mongotest.Commands([]string{"findAndModify"}, b.coll.Name()))
	reads := mongotest.Commands([]string{"find", "aggregate"}, b.coll.Name())
	f.DropReplies(1000, func(c *mongotest.Command) bool { return !healed.Load() && reads(c) })
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := a.Acquire(actx, id)
	require.True(t, fault.HasFired())
	require.NoError(t, err, "Acquire claimed again after its settled claim had expired locally")
	require.Equal(t, int32(1), unknowns.Load(), "the first attempt's outcome was unknown")
	require.Equal(t, int32(1), losts.Load(), "the second settled the claim too late, and released it")
	require.Equal(t, first+2, l.Epoch(), "the unknown claim, then the new one")
	require.NoError(t, l.Err())
	require.Positive(t, l.TimeLeft())
	d := load(t, b.coll, id)
	require.Equal(t, "a", owner(d.Lease))
	require.Equal(t, l.Epoch(), d.Lease.Epoch)
	require.NoError(t, l.Release(ctx))
}

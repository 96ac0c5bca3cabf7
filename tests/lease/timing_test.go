package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/retry"
)

// oneStep is one backoff step of the default Retry policy: the most Acquire
// sleeps between two attempts.
const oneStep = retry.DefaultMaxInterval

// closed reports whether ch is closed now.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestCrashTakeover: a holder that stops renewing without releasing (a crash)
// is taken over after its TTL, and no later than TTL plus one backoff step.
// The crashed holder's context ended before that, and its late Release and
// Renew report ErrLost and change nothing.
func TestCrashTakeover(t *testing.T) { eachMode(t, testCrashTakeover) }

//nolint:thelper // the body of a test, run once per mode
func testCrashTakeover(t *testing.T, mode lease.Mode) {
	const ttl = 400 * time.Millisecond
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	a := b.manager(t, "a", ttl, nil)
	c := b.manager(t, "c", ttl, nil) // default Retry: steps up to 200ms

	// The TTL runs from a's clock estimate, taken after start and before the
	// claim is sent.
	start := time.Now()
	la, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)
	// a crashes here: it neither renews nor releases.
	lc, err := c.Acquire(ctx, id)
	require.NoError(t, err)
	took := time.Since(start)
	t.Logf("takeover after %v (TTL %v, bound TTL + one step = %v)", took, ttl, ttl+oneStep)
	require.GreaterOrEqual(t, took, ttl-20*time.Millisecond, "not before the TTL")
	require.Less(t, took, ttl+oneStep, "within TTL plus one backoff step")
	require.True(t, closed(la.Done()), "the crashed holder's context ended before the takeover")
	require.ErrorIs(t, la.Err(), lease.ErrLost)
	require.Equal(t, int64(2), lc.Epoch())

	held := loadRaw(t, b.coll, id)
	err = la.Release(ctx)
	require.ErrorIs(t, err, lease.ErrLost)
	var lost *lease.LostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, "c", lost.Holder, "the release names the new holder")
	require.Equal(t, lease.TakenOver, lost.Reason)
	require.ErrorIs(t, la.Renew(ctx), lease.ErrLost)
	require.Equal(t, held, loadRaw(t, b.coll, id), "a release after the loss changes nothing")
	require.NoError(t, lc.Release(ctx))
}

// TestPausedHolder: a holder running under Do whose traffic is paused past
// its TTL is taken over. Its context was cancelled before the takeover
// happened, and its fenced write, sent after the pause, fails and changes
// nothing. Do reports the loss with fn's error.
func TestPausedHolder(t *testing.T) { eachMode(t, testPausedHolder) }

//nolint:thelper // the body of a test, run once per mode
func testPausedHolder(t *testing.T, mode lease.Mode) {
	const ttl = 500 * time.Millisecond
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	f := b.db.Faulty(t, nil)
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", ttl, nil)
	// c's own lease outlives the wait for a's fenced write below.
	c := b.manager(t, "c", 10*time.Second, &lease.Options{Retry: fastRetry})

	var (
		cancelledAt time.Time
		cause       error
		fencedErr   error
		fencedRes   int64 = -1
		paused            = make(chan struct{})
		errFn             = errors.New("fn saw its context end")
	)
	done := make(chan error, 1)
	go func() {
		done <- a.Do(ctx, id, func(lctx context.Context, l *lease.Lease) error {
			coll := f.Collection(b.coll.Name())
			res, err := coll.UpdateOne(lctx, append(bson.D{{Key: "_id", Value: id}}, l.Fence()...),
				bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "a, while held"}}}})
			if err != nil || res.ModifiedCount != 1 {
				return fmt.Errorf("fenced write while held: %+v: %w", res, err)
			}
			f.Pause(3 * ttl) // holds every request and reply of a's client
			close(paused)
			<-lctx.Done()
			cancelledAt = time.Now()
			cause = context.Cause(lctx)
			// A holder that ignores its context still cannot write: the
			// fence no longer matches once c holds the lease.
			res, fencedErr = coll.UpdateOne(context.Background(), append(bson.D{{Key: "_id", Value: id}}, l.Fence()...),
				bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "a, after the pause"}}}})
			if fencedErr == nil {
				fencedRes = res.MatchedCount
			}
			return errFn
		})
	}()

	<-paused
	// c tries until it holds the lease, noting when each attempt started.
	var takeoverSent time.Time
	var lc *lease.Lease
	for {
		sent := time.Now()
		l, err := c.TryAcquire(ctx, id)
		if err == nil {
			lc, takeoverSent = l, sent
			break
		}
		require.ErrorIs(t, err, lease.ErrHeld)
		time.Sleep(5 * time.Millisecond)
	}
	err := <-done
	t.Logf("a's context cancelled %v before c's winning claim was sent", takeoverSent.Sub(cancelledAt))
	require.False(t, cancelledAt.IsZero())
	require.True(t, cancelledAt.Before(takeoverSent), "the holder stopped before the takeover")

	require.NoError(t, fencedErr)
	require.Equal(t, int64(0), fencedRes, "the fenced write matched nothing")
	d := load(t, b.coll, id)
	require.Equal(t, "a, while held", d.Data, "the stale holder changed nothing")
	require.Equal(t, "c", owner(d.Lease))
	require.Equal(t, lc.Epoch(), d.Lease.Epoch)

	require.ErrorIs(t, err, lease.ErrLost)
	require.ErrorIs(t, err, errFn, "Do returns fn's error inside the loss")
	var lost *lease.LostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, lease.TakenOver, lost.Reason, "the release found c holding it")
	require.Equal(t, "c", lost.Holder)
	require.ErrorAs(t, cause, &lost, "fn's context ended for the loss")
	require.Equal(t, lease.Expired, lost.Reason, "at the local deadline")
	require.NoError(t, lc.Release(ctx))
}

// TestSkew: clients whose wall clocks are ten minutes fast or slow neither
// steal a live lease nor wait for a dead one, as holders or as contenders.
func TestSkew(t *testing.T) { eachMode(t, testSkew) }

//nolint:thelper // the body of a test, run once per mode
func testSkew(t *testing.T, mode lease.Mode) {
	const ttl = 400 * time.Millisecond
	b := setup(t, mode)
	ctx := context.Background()
	skewed := func(d time.Duration) func() time.Time {
		return func() time.Time { return time.Now().Add(d) }
	}
	for _, skew := range []time.Duration{-10 * time.Minute, 10 * time.Minute} {
		for _, skewedHolder := range []bool{false, true} {
			name := fmt.Sprintf("skew %v holder skewed %v", skew, skewedHolder)
			holderNow, contenderNow := time.Now, skewed(skew)
			if skewedHolder {
				holderNow, contenderNow = skewed(skew), time.Now
			}
			id := b.insert(t)
			h := b.manager(t, "holder", ttl, &lease.Options{Now: holderNow})
			c := b.manager(t, "contender", ttl, &lease.Options{Now: contenderNow})

			start := time.Now()
			lh, err := h.TryAcquire(ctx, id)
			require.NoError(t, err, name)
			// A skew mistaken for time would show as minutes; the claim's
			// own round trips (and a loaded machine) only shorten the time
			// left, never lengthen it past the TTL.
			require.LessOrEqual(t, lh.TimeLeft(), ttl, name)
			require.Greater(t, lh.TimeLeft(), ttl/4, name)

			// No steal.
			_, err = c.TryAcquire(ctx, id)
			require.ErrorIs(t, err, lease.ErrHeld, name)
			var held *lease.HeldError
			require.ErrorAs(t, err, &held, name)
			require.Greater(t, held.TimeLeft, ttl/2, name)
			require.Less(t, held.TimeLeft, ttl+50*time.Millisecond, name)

			// No waiting for a dead one: the holder is gone.
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			lc, err := c.Acquire(wctx, id)
			cancel()
			require.NoError(t, err, name)
			took := time.Since(start)
			t.Logf("%s: takeover after %v", name, took)
			require.GreaterOrEqual(t, took, ttl-20*time.Millisecond, name)
			require.Less(t, took, ttl+oneStep, name)
			require.True(t, closed(lh.Done()), name)
			require.NoError(t, lc.Release(ctx), name)
		}
	}
}

// TestDo: Do renews the lease while fn runs past several TTLs, hands fn a
// live context, returns fn's error and releases; it leaves no goroutine
// behind, also when fn panics.
func TestDo(t *testing.T) { eachMode(t, testDo) }

//nolint:thelper // the body of a test, run once per mode
func testDo(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	m := b.manager(t, "a", ttl, nil)
	id := b.insert(t)
	warm(t, b)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	errBoom := errors.New("boom")
	var first time.Time
	var l0 *lease.Lease
	err := m.Do(ctx, id, func(ctx context.Context, l *lease.Lease) error {
		l0, first = l, l.ExpiresAt()
		select {
		case <-ctx.Done():
			return fmt.Errorf("context ended: %w", context.Cause(ctx))
		case <-time.After(4 * ttl):
		}
		res, err := b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, l.Fence()...),
			bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "done"}}}})
		if err != nil || res.ModifiedCount != 1 {
			return fmt.Errorf("fenced write: %+v: %w", res, err)
		}
		return errBoom
	})
	require.ErrorIs(t, err, errBoom)
	require.NotErrorIs(t, err, lease.ErrLost)
	require.True(t, l0.ExpiresAt().After(first.Add(2*ttl)), "renewed in the background")
	require.ErrorIs(t, l0.Err(), lease.ErrReleased)
	d := load(t, b.coll, id)
	require.Equal(t, "done", d.Data)
	require.Empty(t, owner(d.Lease), "released")

	require.NoError(t, m.Do(ctx, id, func(context.Context, *lease.Lease) error { return nil }))

	// A panic releases the lease, then goes on.
	func() {
		defer func() { require.Equal(t, "fn panics", recover()) }()
		_ = m.Do(ctx, id, func(context.Context, *lease.Lease) error { panic("fn panics") })
	}()
	d = load(t, b.coll, id)
	require.Empty(t, owner(d.Lease), "released on panic")
	require.Equal(t, int64(3), d.Lease.Epoch)
}

// TestDoTakenOver: when a renewal finds the lease taken over, fn's context is
// cancelled at once with a *LostError naming the new holder, and Do returns
// the loss with fn's error.
func TestDoTakenOver(t *testing.T) { eachMode(t, testDoTakenOver) }

//nolint:thelper // the body of a test, run once per mode
func testDoTakenOver(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	m := b.manager(t, "a", ttl, &lease.Options{RenewEvery: 50 * time.Millisecond})
	id := b.insert(t)
	warm(t, b)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	var cause error
	err := m.Do(ctx, id, func(ctx context.Context, l *lease.Lease) error {
		// Someone else overwrites the lease record (an operator, a buggy
		// writer): the next renewal sees it.
		_, err := b.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{
			{Key: "$set", Value: bson.D{{Key: "_lease.owner", Value: "intruder"}}},
			{Key: "$inc", Value: bson.D{{Key: "_lease.epoch", Value: 1}}},
		})
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return ctx.Err()
		case <-time.After(ttl):
			return errors.New("not cancelled")
		}
	})
	require.ErrorIs(t, err, lease.ErrLost)
	require.ErrorIs(t, err, context.Canceled)
	var lost *lease.LostError
	require.ErrorAs(t, cause, &lost)
	require.Equal(t, lease.TakenOver, lost.Reason)
	require.Equal(t, "intruder", lost.Holder)
	d := load(t, b.coll, id)
	require.Equal(t, "intruder", owner(d.Lease), "Do's release changed nothing")
}

// TestAcquireWaitsForRelease: Acquire gets the lease soon after the holder
// releases it, long before it would expire, and gives up with the holder's
// details when its context ends.
func TestAcquireWaitsForRelease(t *testing.T) { eachMode(t, testAcquireWaitsForRelease) }

//nolint:thelper // the body of a test, run once per mode
func testAcquireWaitsForRelease(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	a := b.manager(t, "a", time.Minute, nil)
	c := b.manager(t, "c", time.Minute, nil)
	la, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.Acquire(short, id)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, lease.ErrHeld)

	var wg sync.WaitGroup
	var got *lease.Lease
	var gotAt time.Time
	var gotErr error
	wg.Go(func() {
		got, gotErr = c.Acquire(ctx, id)
		gotAt = time.Now()
	})
	time.Sleep(300 * time.Millisecond)
	releasedAt := time.Now()
	require.NoError(t, la.Release(ctx))
	wg.Wait()
	require.NoError(t, gotErr)
	t.Logf("acquired %v after the release", gotAt.Sub(releasedAt))
	require.Less(t, gotAt.Sub(releasedAt), oneStep+100*time.Millisecond)
	require.Equal(t, int64(2), got.Epoch())
	require.NoError(t, got.Release(ctx))
}

// warm opens a few pooled connections before goleak's snapshot, so that the
// proxy goroutines serving them are not reported as leaks of the test.
func warm(t *testing.T, b *bundle) {
	t.Helper()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _, _ = b.coll.CountDocuments(context.Background(), bson.D{}) })
	}
	wg.Wait()
	_, err := b.clock.Now(context.Background())
	require.NoError(t, err)
}

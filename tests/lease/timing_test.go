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

// TestCrashTakeover: a holder that stops renewing without releasing (a crash)
// is taken over after its TTL, within one backoff step more: Acquire sleeps
// until the holder's time is up (with a claim half-way while more than four
// steps are left), never more than five steps at a time. The crashed holder's deadline,
// and the end of its context, came before the winning claim was sent, and
// its late Release and Renew report ErrLost and change nothing.
//
// The guarantee assumes timers and messages late by less than SafetyMargin;
// the test sets one (half the TTL) that a loaded machine stays within. How
// long c waits is judged by the sleeps it asked for, not by the wall clock,
// which a busy machine stretches.
func TestCrashTakeover(t *testing.T) { eachMode(t, testCrashTakeover) }

//nolint:thelper // the body of a test, run once per mode
func testCrashTakeover(t *testing.T, mode lease.Mode) {
	const ttl, margin = 4 * time.Second, 2 * time.Second
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	a := b.manager(t, "a", ttl, &lease.Options{SafetyMargin: margin})
	ccoll, claimSent := claimLog(t, b)
	sleeps := &sleepLog{}
	// c: the default Retry intervals (steps up to oneStep), on a clock that
	// notes every sleep.
	c := b.managerOn(t, ccoll, "c", ttl, &lease.Options{Retry: retry.Policy{Clock: sleeps}})

	// The TTL runs from a's claim, sent after start.
	start := time.Now()
	la, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)
	ended := noteEnd(la)
	// a crashes here: it neither renews nor releases.
	lc, err := c.Acquire(ctx, id)
	require.NoError(t, err)
	took := time.Since(start)
	sent := claimSent()
	cancelledAt := ended()
	n, longest := sleeps.longest()
	slept := sleeps.total()
	t.Logf("takeover after %v (TTL %v), %d sleeps asking for %v, the longest %v; a's deadline %v and context end %v before c's winning claim was sent",
		took, ttl, n, slept, longest, sent.Sub(la.Deadline()), sent.Sub(cancelledAt))
	require.GreaterOrEqual(t, took, ttl-20*time.Millisecond, "not before the TTL")
	require.Positive(t, n, "c waited")
	require.LessOrEqual(t, longest, 5*oneStep, "Acquire sleeps five backoff steps at most")
	require.LessOrEqual(t, slept, ttl+oneStep, "c asked to sleep no more than one backoff step past the TTL")
	require.True(t, la.Deadline().Before(sent), "a's deadline %v came before c's winning claim was sent at %v", la.Deadline(), sent)
	require.False(t, cancelledAt.IsZero(), "a's context ended")
	require.True(t, cancelledAt.Before(sent), "a's context ended before c's winning claim was sent")
	require.ErrorIs(t, la.Err(), lease.ErrLost)
	require.Equal(t, la.Epoch()+1, lc.Epoch())

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

// noteEnd notes when l's context ends, as seen by a goroutine that waits for
// it: no earlier than the end itself. The function it returns waits for
// that, for up to a minute, and returns the time, or the zero time if the
// context did not end.
func noteEnd(l *lease.Lease) func() time.Time {
	var at time.Time
	noted := make(chan struct{})
	context.AfterFunc(l.Context(), func() {
		at = time.Now()
		close(noted)
	})
	return func() time.Time {
		select {
		case <-noted:
			return at
		case <-time.After(time.Minute):
			return time.Time{}
		}
	}
}

// TestPausedHolder: a holder running under Do whose traffic is paused past
// its TTL is taken over. Its deadline passed, and its context was
// cancelled, before the winning claim was sent; its fenced write, sent after
// the takeover, fails and changes nothing. Do reports the loss with fn's
// error.
//
// As in TestCrashTakeover, the SafetyMargin is half the TTL.
func TestPausedHolder(t *testing.T) { eachMode(t, testPausedHolder) }

//nolint:thelper // the body of a test, run once per mode
func testPausedHolder(t *testing.T, mode lease.Mode) {
	// 4 s: a claim slow on a busy machine still leaves the lease live.
	const ttl, margin = 4 * time.Second, 2 * time.Second
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	f := b.db.Faulty(t, nil)
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", ttl, &lease.Options{SafetyMargin: margin})
	// c's own lease outlives everything below.
	c := b.manager(t, "c", time.Minute, &lease.Options{Retry: fastRetry})

	var (
		cancelledAt time.Time
		deadline    time.Time
		cause       error
		fencedErr   error
		fencedRes   int64 = -1
		paused            = make(chan struct{})
		takenOver         = make(chan struct{})
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
			// Holds every request and reply of a's client, renewals
			// included, until well past a's deadline.
			f.Pause(2 * ttl)
			close(paused)
			select {
			case <-lctx.Done():
			case <-time.After(time.Minute):
				return errors.New("the lease's context did not end")
			}
			cancelledAt, deadline = time.Now(), l.Deadline()
			cause = context.Cause(lctx)
			// A holder that ignores its context still cannot write: the
			// fence no longer matches once c holds the lease.
			select {
			case <-takenOver:
			case <-time.After(time.Minute):
				return errors.New("c did not take the lease over")
			}
			res, fencedErr = coll.UpdateOne(context.Background(), append(bson.D{{Key: "_id", Value: id}}, l.Fence()...),
				bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "a, after the pause"}}}})
			if fencedErr == nil {
				fencedRes = res.MatchedCount
			}
			return errFn
		})
	}()

	select {
	case <-paused:
	case err := <-done:
		t.Fatalf("Do returned before its function paused a's traffic: %v", err)
	}
	// c tries until it holds the lease, noting when each attempt started:
	// before its claim was sent.
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
	close(takenOver)
	err := <-done
	t.Logf("a's deadline %v and context end %v before c's winning claim was sent",
		takeoverSent.Sub(deadline), takeoverSent.Sub(cancelledAt))
	require.False(t, cancelledAt.IsZero(), "fn saw its context end: %v", err)
	require.True(t, deadline.Before(takeoverSent), "a's deadline came before c's winning claim was sent")
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
// A skew mistaken for time shows as minutes; the bounds below are a TTL or
// two, which load does not reach. The four cases run in parallel, each on its
// own document.
func TestSkew(t *testing.T) { eachMode(t, testSkew) }

//nolint:thelper // the body of a test, run once per mode
func testSkew(t *testing.T, mode lease.Mode) {
	const ttl, margin = 2 * time.Second, time.Second
	b := setup(t, mode)
	skewed := func(d time.Duration) func() time.Time {
		return func() time.Time { return time.Now().Add(d) }
	}
	for _, skew := range []time.Duration{-10 * time.Minute, 10 * time.Minute} {
		for _, skewedHolder := range []bool{false, true} {
			name := fmt.Sprintf("skew %v holder skewed %v", skew, skewedHolder)
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				holderNow, contenderNow, holderSkew := time.Now, skewed(skew), time.Duration(0)
				if skewedHolder {
					holderNow, contenderNow, holderSkew = skewed(skew), time.Now, skew
				}
				id := b.insert(t)
				h := b.manager(t, "holder", ttl, &lease.Options{Now: holderNow, SafetyMargin: margin})
				ccoll, claimSent := claimLog(t, b)
				c := b.managerOn(t, ccoll, "contender", ttl, &lease.Options{Now: contenderNow})

				start := time.Now()
				before := holderNow()
				lh, err := h.TryAcquire(ctx, id)
				require.NoError(t, err)
				// On the holder's clock, its deadline is after the claim was
				// sent and at most TTL after.
				require.True(t, lh.Deadline().After(before))
				require.False(t, lh.Deadline().After(before.Add(ttl)))

				// No steal.
				_, err = c.TryAcquire(ctx, id)
				require.ErrorIs(t, err, lease.ErrHeld)
				var held *lease.HeldError
				require.ErrorAs(t, err, &held)
				require.Positive(t, held.TimeLeft)
				require.Less(t, held.TimeLeft, ttl+ttl/2)

				// No waiting for a dead one: the holder is gone.
				wctx, cancel := context.WithTimeout(ctx, time.Minute)
				lc, err := c.Acquire(wctx, id)
				cancel()
				require.NoError(t, err)
				took := time.Since(start)
				sent := claimSent()
				t.Logf("takeover after %v; the holder's deadline %v before the winning claim was sent", took, sent.Sub(lh.Deadline().Add(-holderSkew)))
				require.GreaterOrEqual(t, took, ttl-20*time.Millisecond, "not before the TTL")
				require.Less(t, took, 2*ttl, "not waiting out a skew")
				require.True(t, lh.Deadline().Add(-holderSkew).Before(sent), "the holder's deadline came before the winning claim was sent")
				select {
				case <-lh.Done():
				case <-time.After(time.Minute):
					t.Fatal("the holder's context did not end")
				}
				require.ErrorIs(t, lh.Err(), lease.ErrLost)
				require.NoError(t, lc.Release(ctx))
			})
		}
	}
}

// renewed waits until l's deadline moves (a renewal was applied), for up to
// half a minute, or until ctx ends.
func renewed(ctx context.Context, l *lease.Lease) error {
	from := l.Deadline()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	giveUp := time.After(30 * time.Second)
	for l.Deadline().Equal(from) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("context ended: %w", context.Cause(ctx))
		case <-giveUp:
			return errors.New("no renewal within 30s")
		case <-tick.C:
		}
	}
	return nil
}

// TestDo: Do renews the lease while fn runs past several TTLs, hands fn a
// live context, returns fn's error and releases; it leaves no goroutine
// behind, also when fn panics.
//
// The TTLs pass on a local clock the test moves a quarter TTL at a time,
// each time after a renewal, so that no stall of a loaded machine makes a
// renewal late; the renewals themselves run on Do's real timer.
func TestDo(t *testing.T) { eachMode(t, testDo) }

//nolint:thelper // the body of a test, run once per mode
func testDo(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	const ttl = time.Minute
	sc, clock := b.fakeTime()
	m := b.manager(t, "a", ttl, &lease.Options{Now: sc.now, Clock: clock, RenewEvery: 20 * time.Millisecond})
	id := b.insert(t)
	warm(t, b)
	_, err := clock.Now(ctx)
	require.NoError(t, err)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	errBoom := errors.New("boom")
	var first, firstDeadline time.Time
	var l0 *lease.Lease
	err = m.Do(ctx, id, func(ctx context.Context, l *lease.Lease) error {
		l0, first, firstDeadline = l, l.ExpiresAt(), l.Deadline()
		for range 16 { // four TTLs
			if err := renewed(ctx, l); err != nil {
				return err
			}
			sc.pass(ttl / 4)
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
	require.True(t, l0.Deadline().After(firstDeadline.Add(3*ttl)), "renewed in the background")
	if mode == lease.ModeServer {
		// The server's clock, which sets the expiry, ran in real time.
		require.True(t, l0.ExpiresAt().After(first), "renewed in the background")
	} else {
		require.True(t, l0.ExpiresAt().After(first.Add(2*ttl)), "renewed in the background")
	}
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
	require.Equal(t, l0.Epoch()+2, d.Lease.Epoch)
}

// TestDoTakenOver: when a renewal finds the lease taken over, fn's context is
// cancelled at once with a *LostError naming the new holder (not at the
// local deadline, a minute away), and Do returns the loss with fn's error.
func TestDoTakenOver(t *testing.T) { eachMode(t, testDoTakenOver) }

//nolint:thelper // the body of a test, run once per mode
func testDoTakenOver(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	const ttl = time.Minute
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
		case <-time.After(ttl / 2):
			return errors.New("not cancelled")
		}
	})
	require.ErrorIs(t, err, lease.ErrLost)
	require.ErrorIs(t, err, context.Canceled)
	var lost *lease.LostError
	require.ErrorAs(t, cause, &lost)
	require.Equal(t, lease.TakenOver, lost.Reason, "found by a renewal, not by the deadline")
	require.Equal(t, "intruder", lost.Holder)
	d := load(t, b.coll, id)
	require.Equal(t, "intruder", owner(d.Lease), "Do's release changed nothing")
}

// TestAcquireWaitsForRelease: Acquire, waiting for a lease held for another
// minute, sleeps five backoff steps at most at a time, and the release of
// the holder (in this process) cuts that sleep short: with 2 s steps, it
// gets the lease well within the 10 s sleep it was in, which a busy machine
// does not stretch that far; and it gives up with the holder's details when
// its context ends.
func TestAcquireWaitsForRelease(t *testing.T) { eachMode(t, testAcquireWaitsForRelease) }

//nolint:thelper // the body of a test, run once per mode
func testAcquireWaitsForRelease(t *testing.T, mode lease.Mode) {
	const ttl = time.Minute
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	a := b.manager(t, "a", ttl, nil)
	la, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)

	// The context ends while Acquire waits, after an attempt found the lease
	// held.
	short, cancel := context.WithCancel(ctx)
	quitter := b.manager(t, "q", ttl, &lease.Options{Retry: retry.Policy{OnRetry: func(retry.Attempt) { cancel() }}})
	_, err = quitter.Acquire(short, id)
	cancel()
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, lease.ErrHeld)
	var held *lease.HeldError
	require.ErrorAs(t, err, &held)
	require.Equal(t, "a", held.Owner)

	// c finds the lease held and sleeps, then a releases.
	const step = 2 * time.Second
	sleeps := &sleepLog{}
	waiting := make(chan struct{})
	c := b.manager(t, "c", ttl, &lease.Options{Retry: retry.Policy{
		Clock:       sleeps,
		MaxInterval: step,
		OnRetry: func(at retry.Attempt) {
			if at.Number == 1 {
				close(waiting)
			}
		},
	}})
	var got *lease.Lease
	var gotAt time.Time
	var gotErr error
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		got, gotErr = c.Acquire(ctx, id)
		gotAt = time.Now()
	}()
	select {
	case <-waiting: // an attempt found the lease held
	case <-returned:
		require.Fail(t, "Acquire returned while the lease was held", "%v", gotErr)
	}
	releasedAt := time.Now()
	require.NoError(t, la.Release(ctx))
	<-returned
	require.NoError(t, gotErr)
	n, longest := sleeps.longest()
	t.Logf("acquired %v after the release; %d sleeps, the longest %v", gotAt.Sub(releasedAt), n, longest)
	require.Equal(t, 5*step, longest, "a minute left: sleeps of five steps, never longer")
	require.Less(t, gotAt.Sub(releasedAt), longest/2, "woken by the release, not at the end of its sleep")
	require.Equal(t, la.Epoch()+1, got.Epoch())
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

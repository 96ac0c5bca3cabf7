package lease_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
)

// commandLog returns b's database through a client of its own (to the
// server, another process) and a function that returns, and forgets, the
// commands it sent to that database: hello and the driver's monitoring,
// sent to admin, are left out.
func commandLog(t *testing.T, b *bundle) (*mongo.Database, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var names []string
	db := b.coll.Database().Name()
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.DatabaseName == db {
			mu.Lock()
			names = append(names, e.CommandName)
			mu.Unlock()
		}
	}}
	f := b.db.Faulty(t, &mongotest.FaultyOptions{ClientOptions: options.Client().SetMonitor(mon)})
	return f.Collection(b.coll.Name()).Database(), func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := names
		names = nil
		return out
	}
}

// warmed makes m's once-per-process work (the server's capabilities, the
// claim's projection where the server refuses it) on a document of its own,
// so that what a test counts next is the steady state.
func warmed(t *testing.T, b *bundle, m *lease.Manager) {
	t.Helper()
	id := b.insert(t)
	l, err := m.TryAcquire(context.Background(), id)
	require.NoError(t, err)
	require.NoError(t, l.Release(context.Background()))
}

// TestWaitingOutCrashedHolderSendsFewCommands: a contender in another
// process (a client of its own: no line, no wake from this one) waits out
// a holder that crashed with a 1 s lease. It sleeps until the lease is up,
// with one claim half-way, instead of polling every backoff step (5 times
// in that second): 2 sleeps, 3 when a busy machine's slow round trip makes
// a claim come before the server's time is up; after each sleep a claim,
// and a read when a claim finds the holder and does not say until when (4
// commands when all goes well: a failed claim, the read that says when the
// lease is up, the claim half-way, the winning claim); and its sleeps ask
// for no more than the TTL plus one backoff step (what they ask, not the
// wall clock, which a busy machine stretches).
func TestWaitingOutCrashedHolderSendsFewCommands(t *testing.T) {
	eachMode(t, testWaitingOutCrashedHolderSendsFewCommands)
}

//nolint:thelper // the body of a test, run once per mode
func testWaitingOutCrashedHolderSendsFewCommands(t *testing.T, mode lease.Mode) {
	const ttl = time.Second
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	a := b.manager(t, "a", ttl, nil)
	cdb, commands := commandLog(t, b)
	sleeps := &sleepLog{}
	c := b.managerOn(t, cdb.Collection(b.coll.Name()), "c", ttl, &lease.Options{Retry: retry.Policy{Clock: sleeps}})
	warmed(t, b, c)
	commands()

	start := time.Now()
	la, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)
	// a crashes here: it neither renews nor releases.
	lc, err := c.Acquire(ctx, id)
	require.NoError(t, err)
	took := time.Since(start)
	sent := commands()
	slept := sleeps.total()
	n, _ := sleeps.longest()
	t.Logf("takeover after %v (TTL %v), %d sleeps asking for %v; %d commands: %v", took, ttl, n, slept, len(sent), sent)
	require.GreaterOrEqual(t, took, ttl-20*time.Millisecond, "not before the TTL")
	require.LessOrEqual(t, slept, ttl+oneStep, "sleeps within the TTL and one backoff step")
	require.LessOrEqual(t, n, 3, "sleeps until the lease is up, not polling")
	require.LessOrEqual(t, len(sent), 2*n+1, "a claim after each sleep, a read after a claim that found the holder: %v", sent)
	require.ErrorIs(t, la.Err(), lease.ErrLost)
	require.Equal(t, la.Epoch()+1, lc.Epoch())
	require.NoError(t, lc.Release(ctx))
}

// TestFirstLeaseCommands: the first lease of a document never leased costs
// one command in ModeServer (the claim's pipeline takes the first epoch
// from $$NOW) and two in ModeEstimated (a claim that matches a record with
// no epoch, then the write of its first epoch), no failed claim and no
// read; a named lease's first costs two in ModeEstimated (the claim is an
// upsert) and three in ModeServer (an upsert may not carry $expr: a claim
// that matches nothing, a read, the upsert). Either way the first epoch is
// the server's time in microseconds + 1, and the next claim adds one.
func TestFirstLeaseCommands(t *testing.T) { eachMode(t, testFirstLeaseCommands) }

//nolint:thelper // the body of a test, run once per mode
func testFirstLeaseCommands(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	cdb, commands := commandLog(t, b)
	docs := b.managerOn(t, cdb.Collection(b.coll.Name()), "c", time.Minute, nil)
	warmed(t, b, docs)
	names, err := lease.NewNamed(cdb.Collection("locks"), &lease.Options{TTL: time.Minute, Owner: "c", Mode: mode})
	require.NoError(t, err)
	wantDoc, wantName := 1, 3
	if mode == lease.ModeEstimated {
		wantDoc, wantName = 2, 2
	}
	for _, tc := range []struct {
		what string
		m    *lease.Manager
		id   any
		want int
	}{
		{"document", docs, b.insert(t), wantDoc},
		{"name", names, "job-" + time.Now().Format(time.RFC3339Nano), wantName},
	} {
		commands()
		l, err := tc.m.TryAcquire(ctx, tc.id)
		require.NoError(t, err, tc.what)
		sent := commands()
		t.Logf("%s: first lease, %d commands: %v", tc.what, len(sent), sent)
		require.Len(t, sent, tc.want, "%s: %v", tc.what, sent)
		require.WithinDuration(t, l.AcquiredAt(), time.UnixMicro(l.Epoch()), 5*time.Second, "%s: the first epoch is the server's time in µs", tc.what)
		require.NoError(t, l.Release(ctx))
		next, err := tc.m.TryAcquire(ctx, tc.id)
		require.NoError(t, err, tc.what)
		require.Len(t, commands(), 2, "%s: a release and one claim", tc.what)
		require.Equal(t, l.Epoch()+1, next.Epoch(), tc.what)
		require.NoError(t, next.Release(ctx))
	}
}

// TestAcquireSleepsNoLongerThanMaxElapsedTime: Acquire sleeps until the
// holder's time is up, but no sleep of it ends after the Policy's
// MaxElapsedTime: waiting for a lease held another minute with a 300 ms
// MaxElapsedTime, it gives up after at least 300 ms, its sleeps asking for
// no more than that, with retry.ErrExhausted and the holder's *HeldError.
// It sleeps between its attempts, unless its first attempt alone outlasted
// the 300 ms (a busy machine): then it gives up without sleeping.
func TestAcquireSleepsNoLongerThanMaxElapsedTime(t *testing.T) {
	eachMode(t, testAcquireSleepsNoLongerThanMaxElapsedTime)
}

//nolint:thelper // the body of a test, run once per mode
func testAcquireSleepsNoLongerThanMaxElapsedTime(t *testing.T, mode lease.Mode) {
	const limit = 300 * time.Millisecond
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	la, err := b.manager(t, "a", time.Minute, nil).TryAcquire(ctx, id)
	require.NoError(t, err)
	sleeps := &sleepLog{}
	var retried atomic.Bool
	c := b.manager(t, "c", time.Minute, &lease.Options{Retry: retry.Policy{MaxElapsedTime: limit, Clock: sleeps,
		OnRetry: func(retry.Attempt) { retried.Store(true) }}})
	start := time.Now()
	_, err = c.Acquire(ctx, id)
	took := time.Since(start)
	slept := sleeps.total()
	t.Logf("gave up after %v, sleeps asking for %v: %v", took, slept, err)
	require.ErrorIs(t, err, retry.ErrExhausted)
	require.ErrorIs(t, err, lease.ErrHeld)
	require.GreaterOrEqual(t, took, limit-20*time.Millisecond, "waited")
	if retried.Load() {
		require.Positive(t, slept, "slept between attempts")
	} else {
		require.Zero(t, slept, "gave up after its first attempt, without sleeping")
	}
	require.LessOrEqual(t, slept, limit, "no sleep past MaxElapsedTime")
	require.NoError(t, la.Release(ctx))
}

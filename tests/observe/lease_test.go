package observe_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/observe"
)

// The lease tests run in the backend's own mode (ModeAuto): ModeEstimated on
// the embedded FerretDB, ModeServer on DocumentDB or MongoDB.

type leaseFixture struct {
	db   *mongotest.DB
	coll *mongo.Collection
	id   bson.ObjectID
}

func newLeases(t *testing.T) *leaseFixture {
	t.Helper()
	db := mongotest.New(t)
	f := &leaseFixture{db: db, coll: db.Collection("users"), id: bson.NewObjectID()}
	_, err := f.coll.InsertOne(t.Context(), bson.D{{Key: "_id", Value: f.id}, {Key: "name", Value: "ana"}})
	require.NoError(t, err)
	return f
}

// manager returns a Manager for owner on coll that reports to rec, with its
// mode found and (in ModeEstimated) its clock synced, so that the events
// of the calls a test makes do not depend on which call came first.
func (f *leaseFixture) manager(t *testing.T, coll *mongo.Collection, owner string, rec *recorder, opts *lease.Options) *lease.Manager {
	t.Helper()
	o := lease.Options{TTL: time.Minute}
	if opts != nil {
		o = *opts
	}
	o.Owner = owner
	if rec != nil {
		o.Observer = rec
	}
	m, err := lease.New(coll, &o)
	require.NoError(t, err)
	mode, err := m.Mode(t.Context())
	require.NoError(t, err)
	if mode == lease.ModeEstimated {
		_, err := m.Clock().Now(t.Context())
		require.NoError(t, err)
	}
	if rec != nil {
		rec.reset()
	}
	return m
}

func (f *leaseFixture) lines(t *testing.T, rec *recorder) []string {
	t.Helper()
	return rec.lines(t, f.db.Name(), "users")
}

// TestLeaseLifecycle: a claim, a claim that finds the lease held, a
// renewal, a release.
func TestLeaseLifecycle(t *testing.T) {
	f := newLeases(t)
	ctx := t.Context()
	recA, recB := &recorder{}, &recorder{}
	a := f.manager(t, f.coll, "a", recA, nil)
	b := f.manager(t, f.coll, "b", recB, nil)

	l, err := a.TryAcquire(ctx, f.id)
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, f.id)
	require.ErrorIs(t, err, lease.ErrHeld)
	require.NoError(t, l.Renew(ctx))
	require.NoError(t, l.Release(ctx))

	id, e := f.id.Hex(), l.Epoch()
	requireLines(t, []string{
		"op.start try_acquire id=ObjectID(\"" + id + "\")",
		fmt.Sprintf("lease.acquired try_acquire epoch=%d owner=a", e),
		"op.end try_acquire id=ObjectID(\"" + id + "\") ok",
		"op.start renew id=ObjectID(\"" + id + "\")",
		fmt.Sprintf("lease.renewed renew epoch=%d owner=a", e),
		"op.end renew id=ObjectID(\"" + id + "\") ok",
		"op.start release id=ObjectID(\"" + id + "\")",
		// A lease reports its end with its own context: the acquiring call's.
		fmt.Sprintf("lease.released release epoch=%d owner=a", e),
		"op.end release id=ObjectID(\"" + id + "\") ok",
	}, f.lines(t, recA))
	requireLines(t, []string{
		"op.start try_acquire id=ObjectID(\"" + id + "\")",
		fmt.Sprintf("lease.held acquire holder=a epoch=%d", e),
		"op.end try_acquire id=ObjectID(\"" + id + "\") held",
	}, f.lines(t, recB))

	ev := recA.all()
	require.Equal(t, "try_acquire", recA.in[7], "LeaseReleased comes with the lease's context")
	require.Positive(t, ev[4].TimeLeft, "renewed: the time left")
	require.Positive(t, ev[7].Held, "released: how long it was held")
	require.GreaterOrEqual(t, ev[1].Wait, time.Duration(0))
	require.Positive(t, recB.all()[1].TimeLeft, "held: the holder's time left")
}

// TestLeaseTakeover: a holder whose process stands still (its local clock
// does not move, so its deadline never passes) keeps a Lease whose record
// another owner took over once it expired on the server. Its next renewal
// finds the record taken over: the lease is lost, reported as a warning.
func TestLeaseTakeover(t *testing.T) {
	f := newLeases(t)
	ctx := t.Context()
	recA := &recorder{}
	frozen := time.Now()
	a := f.manager(t, f.coll, "a", recA, &lease.Options{TTL: time.Second, Now: func() time.Time { return frozen }})
	b := f.manager(t, f.coll, "b", nil, &lease.Options{TTL: time.Minute})

	la, err := a.TryAcquire(ctx, f.id)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	lb, err := b.Acquire(wctx, f.id) // waits until the server sees a's lease expired
	require.NoError(t, err)
	recA.reset()

	err = la.Renew(ctx)
	require.ErrorIs(t, err, lease.ErrLost)
	id := f.id.Hex()
	requireLines(t, []string{
		"op.start renew id=ObjectID(\"" + id + "\")",
		fmt.Sprintf("lease.lost in=try_acquire epoch=%d owner=a reason=taken_over holder=b", la.Epoch()),
		"op.end renew id=ObjectID(\"" + id + "\") lost",
	}, f.lines(t, recA))
	lost := recA.all()[1]
	require.ErrorIs(t, lost.Err, lease.ErrLost)
	require.Equal(t, observe.OutcomeLost, recA.all()[2].Outcome)
	require.NoError(t, lb.Release(ctx))
}

// TestLeaseAmbiguousClaim: a claim whose reply the client never gets.
// Dropped: the server applied it, and re-reading its claim id settles it as
// landed. Late copy: it never reached the server (the proxy keeps it); the
// re-read shows it has not landed, so TryAcquire claims again and holds; the
// kept copy, delivered afterwards, changes nothing.
func TestLeaseAmbiguousClaim(t *testing.T) {
	for _, c := range []struct {
		name    string
		arm     func(*mongotest.Faulty) *mongotest.Fault
		settled string
	}{
		{"dropped reply", func(fc *mongotest.Faulty) *mongotest.Fault { return fc.DropNextReply(mongotest.Writes("users")) }, "landed"},
		{"late copy", func(fc *mongotest.Faulty) *mongotest.Fault { return fc.HoldNext(mongotest.Writes("users")) }, "not_landed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newLeases(t)
			ctx := t.Context()
			rec := &recorder{}
			fc := f.db.Faulty(t, nil)
			a := f.manager(t, fc.Collection("users"), "a", rec, nil)
			first, err := a.TryAcquire(ctx, f.id) // the record's first claim, made outside the fault
			require.NoError(t, err)
			require.NoError(t, first.Release(ctx))
			rec.reset()

			fault := c.arm(fc)
			l, err := a.TryAcquire(ctx, f.id)
			require.NoError(t, err)
			require.True(t, fault.HasFired())
			id := f.id.Hex()
			requireLines(t, []string{
				"op.start try_acquire id=ObjectID(\"" + id + "\")",
				"write.ambiguous acquire cause=network",
				"write.settled acquire " + c.settled,
				fmt.Sprintf("lease.acquired try_acquire epoch=%d owner=a", l.Epoch()),
				"op.end try_acquire id=ObjectID(\"" + id + "\") ok",
			}, f.lines(t, rec))
			if c.settled == "not_landed" {
				_, err = fault.Deliver(ctx)
				require.NoError(t, err)
				var d struct {
					Lease struct {
						Epoch int64 `bson:"epoch"`
					} `bson:"_lease"`
				}
				require.NoError(t, f.coll.FindOne(ctx, bson.D{{Key: "_id", Value: f.id}}).Decode(&d))
				require.Equal(t, l.Epoch(), d.Lease.Epoch, "the late copy claimed nothing")
			}
			require.NoError(t, l.Release(ctx))
		})
	}
}

// TestLeaseRenewFailed: the server refuses a renewal before applying it (a
// clear error, not an ambiguous one): the renewal failed, the lease is
// still held.
func TestLeaseRenewFailed(t *testing.T) {
	f := newLeases(t)
	ctx := t.Context()
	rec := &recorder{}
	fc := f.db.Faulty(t, nil)
	a := f.manager(t, fc.Collection("users"), "a", rec, nil)
	l, err := a.TryAcquire(ctx, f.id)
	require.NoError(t, err)
	rec.reset()

	fc.ErrorBeforeApply(mongotest.Writes("users"), mongotest.ServerError{Code: 2, CodeName: "BadValue"})
	err = l.Renew(ctx)
	require.Error(t, err)
	require.NoError(t, l.Err(), "still held")
	id := f.id.Hex()
	requireLines(t, []string{
		"op.start renew id=ObjectID(\"" + id + "\")",
		fmt.Sprintf("lease.renew_failed renew epoch=%d owner=a", l.Epoch()),
		"op.end renew id=ObjectID(\"" + id + "\") error",
	}, f.lines(t, rec))
	require.NoError(t, l.Release(ctx))
}

// TestLeaseClockSync: in ModeEstimated (forced, so it runs on every
// backend) a Manager's own Clock syncs on the first claim, and says so in
// the claim's context.
func TestLeaseClockSync(t *testing.T) {
	f := newLeases(t)
	ctx := t.Context()
	rec := &recorder{}
	a, err := lease.New(f.coll, &lease.Options{TTL: time.Minute, Owner: "a", Mode: lease.ModeEstimated, Observer: rec})
	require.NoError(t, err)
	l, err := a.TryAcquire(ctx, f.id)
	require.NoError(t, err)
	id := f.id.Hex()
	requireLines(t, []string{
		"op.start try_acquire id=ObjectID(\"" + id + "\")",
		"clock.sync in=try_acquire",
		fmt.Sprintf("lease.acquired try_acquire epoch=%d owner=a", l.Epoch()),
		"op.end try_acquire id=ObjectID(\"" + id + "\") ok",
	}, f.lines(t, rec))
	sync := rec.all()[1]
	require.Positive(t, sync.Bound)
	require.Less(t, sync.RTT, sync.Bound*2, "bound = rtt/2 + 0.5ms + drift")
	require.NoError(t, l.Release(ctx))
}

// TestLeaseDo: Do's events nest: the lease acquired, then the release
// (its own operation, in Do's context) before Do ends.
func TestLeaseDo(t *testing.T) {
	f := newLeases(t)
	ctx := t.Context()
	rec := &recorder{}
	a := f.manager(t, f.coll, "a", rec, nil)
	var epoch int64
	require.NoError(t, a.Do(ctx, f.id, func(_ context.Context, l *lease.Lease) error {
		epoch = l.Epoch()
		return nil
	}))
	id := f.id.Hex()
	requireLines(t, []string{
		"op.start do id=ObjectID(\"" + id + "\")",
		fmt.Sprintf("lease.acquired do epoch=%d owner=a", epoch),
		"op.start release id=ObjectID(\"" + id + "\")",
		fmt.Sprintf("lease.released release epoch=%d owner=a", epoch),
		"op.end release id=ObjectID(\"" + id + "\") ok",
		"op.end do id=ObjectID(\"" + id + "\") ok",
	}, f.lines(t, rec))
	require.Equal(t, []string{"", "do", "do", "do", "release", "do"}, rec.in, "release runs in Do's context")

	rec.reset()
	failed := errors.New("partner said no")
	require.ErrorIs(t, a.Do(ctx, f.id, func(context.Context, *lease.Lease) error { return failed }), failed)
	lines := f.lines(t, rec)
	require.Equal(t, "op.end do id=ObjectID(\""+id+"\") aborted", lines[len(lines)-1], "fn's error: the caller's, not the library's")
}

// TestLeaseAcquireWaits: Acquire finds the lease held, waits (a retry per
// wait, caused by the held lease), and acquires it once the holder
// releases. How many waits depends on timing; their shape does not.
func TestLeaseAcquireWaits(t *testing.T) {
	f := newLeases(t)
	ctx := t.Context()
	rec := &recorder{}
	a := f.manager(t, f.coll, "a", nil, nil)
	b := f.manager(t, f.coll, "b", rec, nil)
	la, err := a.TryAcquire(ctx, f.id)
	require.NoError(t, err)

	got := make(chan *lease.Lease, 1)
	go func() {
		l, err := b.Acquire(ctx, f.id)
		if err != nil {
			l = nil
		}
		got <- l
	}()
	require.Eventually(t, func() bool { return len(rec.all()) >= 3 }, time.Minute, time.Millisecond, "b waits")
	require.NoError(t, la.Release(ctx))
	lb := <-got
	require.NotNil(t, lb)

	lines := f.lines(t, rec)
	id := f.id.Hex()
	n := len(lines)
	require.GreaterOrEqual(t, n, 5)
	require.Equal(t, "op.start acquire id=ObjectID(\""+id+"\")", lines[0])
	for i := 1; i < n-2; i += 2 {
		require.Equal(t, fmt.Sprintf("lease.held acquire holder=a epoch=%d", la.Epoch()), lines[i])
		require.Equal(t, fmt.Sprintf("retry in=acquire attempt=%d cause=held", (i+1)/2), lines[i+1])
	}
	require.Equal(t, fmt.Sprintf("lease.acquired acquire epoch=%d owner=b", lb.Epoch()), lines[n-2])
	require.Equal(t, "op.end acquire id=ObjectID(\""+id+"\") ok", lines[n-1])
	require.Positive(t, rec.all()[n-2].Wait, "acquired: how long it waited")
	require.NoError(t, lb.Release(ctx))
}

package lease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

// fastRetry makes Acquire poll often, so timing tests measure the lease, not
// the backoff.
var fastRetry = retry.Policy{InitialInterval: 2 * time.Millisecond, MaxInterval: 20 * time.Millisecond}

type bundle struct {
	db    *mongotest.DB
	coll  *mongo.Collection
	clock *store.ServerClock
	mode  lease.Mode // set on every Manager the helpers make
}

func setup(t *testing.T, mode lease.Mode) *bundle {
	t.Helper()
	db := mongotest.New(t)
	return &bundle{
		db:    db,
		coll:  db.Collection("docs"),
		clock: store.NewServerClock(store.HelloSampler(db.Client()), nil),
		mode:  mode,
	}
}

// eachMode runs fn as a subtest in ModeServer and in ModeEstimated: the same
// suite proves both. ModeServer runs on a server with $expr, $$NOW in writes
// and update pipelines: the shared one, or the second server mongotest knows
// of where the shared one (the embedded FerretDB v1) has none; it is
// skipped, saying how to run it, only where neither has them (see
// mongotest.Use).
func eachMode(t *testing.T, fn func(t *testing.T, mode lease.Mode)) {
	t.Helper()
	for _, mode := range []lease.Mode{lease.ModeServer, lease.ModeEstimated} {
		t.Run(mode.String(), func(t *testing.T) {
			if mode == lease.ModeServer {
				mongotest.Use(t, mongotest.Expr, mongotest.UpdatePipelines)
			}
			fn(t, mode)
		})
	}
}

// manager returns a document-lease Manager for owner on b.coll, sharing b's
// clock unless opts sets one or a Now.
func (b *bundle) manager(t *testing.T, owner string, ttl time.Duration, opts *lease.Options) *lease.Manager {
	t.Helper()
	return b.managerOn(t, b.coll, owner, ttl, opts)
}

func (b *bundle) managerOn(t *testing.T, coll *mongo.Collection, owner string, ttl time.Duration, opts *lease.Options) *lease.Manager {
	t.Helper()
	o := lease.Options{}
	if opts != nil {
		o = *opts
	}
	o.Owner, o.TTL = owner, ttl
	if o.Mode == lease.ModeAuto {
		o.Mode = b.mode
	}
	if o.Clock == nil && o.Now == nil && coll.Database().Client() == b.db.Client() {
		o.Clock = b.clock
	}
	m, err := lease.New(coll, &o)
	require.NoError(t, err)
	return m
}

// insert adds a document to b.coll and returns its _id.
func (b *bundle) insert(t testing.TB) bson.ObjectID {
	t.Helper()
	id := bson.NewObjectID()
	_, err := b.coll.InsertOne(context.Background(), bson.D{{Key: "_id", Value: id}, {Key: "data", Value: "initial"}})
	require.NoError(t, err)
	return id
}

// rec is the lease record as stored.
type rec struct {
	Owner      *string    `bson:"owner"`
	Epoch      int64      `bson:"epoch"`
	ExpiresAt  *time.Time `bson:"expiresAt"`
	AcquiredAt *time.Time `bson:"acquiredAt"`
}

type doc struct {
	Data  string `bson:"data"`
	Lease rec    `bson:"_lease"`
}

func load(t testing.TB, coll *mongo.Collection, id any) doc {
	t.Helper()
	var d doc
	require.NoError(t, coll.FindOne(context.Background(), bson.D{{Key: "_id", Value: id}}).Decode(&d))
	return d
}

func loadRaw(t testing.TB, coll *mongo.Collection, id any) bson.Raw {
	t.Helper()
	raw, err := coll.FindOne(context.Background(), bson.D{{Key: "_id", Value: id}}).Raw()
	require.NoError(t, err)
	return raw
}

func owner(r rec) string {
	if r.Owner == nil {
		return ""
	}
	return *r.Owner
}

// fakeTime returns a local clock that the test moves forward (time passing
// without waiting for it) and a store.ServerClock over b's server whose readings
// move with it, as if the server's clock had run on alike. Managers given
// both (Options.Now and Options.Clock) see that time pass in ModeEstimated;
// in ModeServer the server's own clock, which judges expiry, does not move.
func (b *bundle) fakeTime() (*slowableClock, *store.ServerClock) {
	sc := &slowableClock{}
	hello := store.HelloSampler(b.db.Client())
	clock := store.NewServerClock(sc.sampler(hello, nil), &store.ServerClockOptions{Now: sc.now})
	return sc, clock
}

// claimLog returns a collection on b's database through a client of its own
// that notes when each findAndModify (a claim or, in ModeServer, a renewal)
// starts to be sent, and a function returning the latest such time: taken
// before the command reaches the wire, so no later than the real send.
func claimLog(t *testing.T, b *bundle) (*mongo.Collection, func() time.Time) {
	t.Helper()
	var mu sync.Mutex
	var last time.Time
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "findAndModify" {
			now := time.Now()
			mu.Lock()
			last = now
			mu.Unlock()
		}
	}}
	f := b.db.Faulty(t, &mongotest.FaultyOptions{ClientOptions: options.Client().SetMonitor(mon)})
	return f.Collection(b.coll.Name()), func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}

// sleepLog is a store.Clock on real time that notes the length of every
// sleep asked of it.
type sleepLog struct {
	mu     sync.Mutex
	sleeps []time.Duration
}

func (s *sleepLog) Now() time.Time { return time.Now() }

func (s *sleepLog) NewTimer(d time.Duration) store.Timer {
	s.mu.Lock()
	s.sleeps = append(s.sleeps, d)
	s.mu.Unlock()
	return realTimer{time.NewTimer(d)}
}

// longest returns the number of sleeps and the longest one.
func (s *sleepLog) longest() (n int, longest time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.sleeps {
		longest = max(longest, d)
	}
	return len(s.sleeps), longest
}

// total returns the sum of the sleeps: how long they were asked to last,
// however late a loaded machine ends them.
func (s *sleepLog) total() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum time.Duration
	for _, d := range s.sleeps {
		sum += d
	}
	return sum
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

func TestAcquireRelease(t *testing.T) { eachMode(t, testAcquireRelease) }

//nolint:thelper // the body of a test, run once per mode
func testAcquireRelease(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	// A TTL no stall of a loaded machine comes near: the lease must stay
	// held through every step below.
	const ttl = time.Minute
	a := b.manager(t, "a", ttl, nil)
	c := b.manager(t, "c", ttl, nil)

	before := time.Now()
	l, err := a.TryAcquire(ctx, id)
	after := time.Now()
	require.NoError(t, err)
	require.Equal(t, "a", l.Owner())
	require.Positive(t, l.Epoch())
	require.Equal(t, id, l.ID())
	require.NoError(t, l.Err())
	// The deadline is at most TTL after the claim was sent, and after the
	// call returned.
	require.True(t, l.Deadline().After(after), "deadline %v, returned at %v", l.Deadline(), after)
	require.False(t, l.Deadline().After(before.Add(ttl)), "deadline %v past send + TTL %v", l.Deadline(), before.Add(ttl))

	d := load(t, b.coll, id)
	require.Equal(t, "initial", d.Data)
	require.Equal(t, "a", owner(d.Lease))
	require.Equal(t, l.Epoch(), d.Lease.Epoch)
	require.NotNil(t, d.Lease.ExpiresAt)
	require.NotNil(t, d.Lease.AcquiredAt)
	require.True(t, d.Lease.ExpiresAt.Equal(l.ExpiresAt()))
	// Expiry is the server's time of the claim + TTL. The server's clock is
	// this host's (the same machine): the second allows for estimate bounds
	// and millisecond truncation, not for load, which the bracket absorbs.
	require.False(t, d.Lease.ExpiresAt.Before(before.Add(ttl-time.Second)), "expiry %v, claim sent at %v", *d.Lease.ExpiresAt, before)
	require.False(t, d.Lease.ExpiresAt.After(after.Add(ttl+time.Second)), "expiry %v, claim returned at %v", *d.Lease.ExpiresAt, after)
	require.Equal(t, ttl, d.Lease.ExpiresAt.Sub(*d.Lease.AcquiredAt))

	// Held: typed error with the holder and the time left.
	_, err = c.TryAcquire(ctx, id)
	require.ErrorIs(t, err, lease.ErrHeld)
	var held *lease.HeldError
	require.ErrorAs(t, err, &held)
	require.Equal(t, "a", held.Owner)
	require.Equal(t, l.Epoch(), held.Epoch)
	require.Equal(t, id, held.ID)
	require.True(t, held.ExpiresAt.Equal(l.ExpiresAt()))
	// About the TTL: more by the contender's estimate bound at most, less by
	// the time since the claim. A wrong reference (the zero time, a skewed
	// clock) would be off by minutes or years.
	require.Positive(t, held.TimeLeft)
	require.Less(t, held.TimeLeft, ttl+ttl/2)

	// The same Manager cannot take it twice.
	_, err = a.TryAcquire(ctx, id)
	require.ErrorIs(t, err, lease.ErrHeld)

	// Fenced write while held.
	res, err := b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, l.Fence()...), bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "by a"}}}})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.ModifiedCount)

	require.NoError(t, l.Release(ctx))
	<-l.Done()
	require.ErrorIs(t, context.Cause(l.Context()), lease.ErrReleased)
	require.ErrorIs(t, l.Err(), lease.ErrReleased)
	d = load(t, b.coll, id)
	require.Equal(t, "by a", d.Data)
	require.Nil(t, d.Lease.Owner, "release clears the owner")
	require.Nil(t, d.Lease.ExpiresAt, "release clears the expiry")
	require.Equal(t, l.Epoch(), d.Lease.Epoch, "release keeps the epoch")

	// Released twice: ErrReleased, nothing written.
	raw := loadRaw(t, b.coll, id)
	require.ErrorIs(t, l.Release(ctx), lease.ErrReleased)
	require.ErrorIs(t, l.Renew(ctx), lease.ErrReleased)
	require.Equal(t, raw, loadRaw(t, b.coll, id))

	// The next claim gets the next epoch; the old fence no longer matches.
	l2, err := c.TryAcquire(ctx, id)
	require.NoError(t, err)
	require.Equal(t, l.Epoch()+1, l2.Epoch())
	res, err = b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, l.Fence()...), bson.D{{Key: "$set", Value: bson.D{{Key: "data", Value: "stale"}}}})
	require.NoError(t, err)
	require.Equal(t, int64(0), res.MatchedCount)
	require.NoError(t, l2.Release(ctx))
}

func TestRenew(t *testing.T) { eachMode(t, testRenew) }

//nolint:thelper // the body of a test, run once per mode
func testRenew(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	// Time passes on a local clock the test moves (and, in ModeEstimated,
	// on the server's clock as the Manager reads it), so no stall of a
	// loaded machine can make a renewal late.
	const ttl = time.Minute
	sc, clock := b.fakeTime()
	a := b.manager(t, "a", ttl, &lease.Options{Now: sc.now, Clock: clock})
	l, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)
	first, firstDeadline := l.ExpiresAt(), l.Deadline()
	// Renew every quarter TTL, for one and a half TTLs: the lease lives on.
	for range 6 {
		sc.pass(ttl / 4)
		time.Sleep(2 * time.Millisecond) // the server's $$NOW moves too (ModeServer)
		require.NoError(t, l.Renew(ctx))
	}
	require.NoError(t, l.Err())
	require.True(t, l.Deadline().After(firstDeadline.Add(ttl)), "deadline moved forward past the first TTL")
	if mode == lease.ModeServer {
		// The server's clock, which sets the expiry, ran in real time.
		require.True(t, l.ExpiresAt().After(first), "expiry moved forward")
	} else {
		require.True(t, l.ExpiresAt().After(first.Add(ttl)), "expiry moved forward past the first TTL")
	}
	d := load(t, b.coll, id)
	require.True(t, d.Lease.ExpiresAt.Equal(l.ExpiresAt()))
	require.Equal(t, l.Epoch(), d.Lease.Epoch, "renewal keeps the epoch")
	require.NoError(t, l.Release(ctx))
}

func TestNotFound(t *testing.T) { eachMode(t, testNotFound) }

//nolint:thelper // the body of a test, run once per mode
func testNotFound(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	m := b.manager(t, "a", time.Second, nil)
	id := bson.NewObjectID()
	_, err := m.TryAcquire(ctx, id)
	require.ErrorIs(t, err, lease.ErrNotFound)
	_, err = m.Acquire(ctx, id)
	require.ErrorIs(t, err, lease.ErrNotFound)
	err = m.Do(ctx, id, func(context.Context, *lease.Lease) error { panic("not called") })
	require.ErrorIs(t, err, lease.ErrNotFound)
	n, err := b.coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Zero(t, n, "a document lease never creates the document")
}

// countingClient returns a collection on b's database through a client that
// counts the commands it sends (heartbeats excluded).
func countingClient(t *testing.T, b *bundle) (*mongo.Collection, func() int) {
	t.Helper()
	var mu sync.Mutex
	var names []string
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		mu.Lock()
		names = append(names, e.CommandName)
		mu.Unlock()
	}}
	f := b.db.Faulty(t, &mongotest.FaultyOptions{ClientOptions: options.Client().SetMonitor(mon)})
	return f.Collection(b.coll.Name()), func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range names {
			if c != "hello" && c != "isMaster" && c != "ping" {
				n++
			}
		}
		return n
	}
}

func TestBadInput(t *testing.T) { eachMode(t, testBadInput) }

//nolint:thelper // the body of a test, run once per mode
func testBadInput(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	coll, commands := countingClient(t, b)
	id := b.insert(t)
	before := loadRaw(t, b.coll, id)

	t.Run("options", func(t *testing.T) {
		for _, tc := range []struct {
			field string
			opts  lease.Options
		}{
			{"TTL", lease.Options{}},
			{"TTL", lease.Options{TTL: -time.Second}},
			{"Owner", lease.Options{TTL: time.Second, Owner: "   "}},
			{"Field", lease.Options{TTL: time.Second, Field: "$lease"}},
			{"Field", lease.Options{TTL: time.Second, Field: "a.b"}},
			{"Field", lease.Options{TTL: time.Second, Field: "_id"}},
			{"SafetyMargin", lease.Options{TTL: time.Second, SafetyMargin: -1}},
			{"SafetyMargin", lease.Options{TTL: time.Second, SafetyMargin: time.Second}},
			{"RenewEvery", lease.Options{TTL: time.Second, RenewEvery: -1}},
			{"RenewEvery", lease.Options{TTL: time.Second, RenewEvery: 950 * time.Millisecond}},
			{"DriftRate", lease.Options{TTL: time.Second, DriftRate: -1}},
			{"Retry", lease.Options{TTL: time.Second, Retry: retry.Policy{Multiplier: 0.5}}},
			{"CleanupAfter", lease.Options{TTL: time.Second, CleanupAfter: -1}},
			{"Retain", lease.Options{TTL: time.Second, Retain: "$until", RetainFor: time.Minute}},
			{"Retain", lease.Options{TTL: time.Second, Retain: "a.b", RetainFor: time.Minute}},
			{"Retain", lease.Options{TTL: time.Second, Retain: "_lease", RetainFor: time.Minute}},
			{"RetainFor", lease.Options{TTL: time.Second, Retain: "until"}},
			{"RetainFor", lease.Options{TTL: time.Second, Retain: "until", RetainFor: time.Second}},
		} {
			for _, newFn := range []func(*mongo.Collection, *lease.Options) (*lease.Manager, error){lease.New, lease.NewNamed} {
				m, err := newFn(coll, &tc.opts)
				require.Nil(t, m)
				require.ErrorIs(t, err, lease.ErrInvalid, "%s: %+v", tc.field, tc.opts)
				var oe *lease.OptionsError
				require.ErrorAs(t, err, &oe)
				require.Equal(t, tc.field, oe.Field, "%v", err)
			}
		}
		m, err := lease.NewNamed(coll, &lease.Options{TTL: time.Second, Retain: "until", RetainFor: time.Minute})
		require.Nil(t, m)
		var oe *lease.OptionsError
		require.ErrorAs(t, err, &oe, "Retain is for document leases only")
		require.Equal(t, "Retain", oe.Field)
		_, err = lease.New(nil, nil)
		require.ErrorIs(t, err, lease.ErrInvalid)
		m, err = lease.New(coll, nil)
		require.NoError(t, err, "nil options are the defaults")
		require.Equal(t, lease.DefaultTTL, m.TTL())
		require.Equal(t, lease.DefaultField, m.Field())
		require.NotEmpty(t, m.Owner())
	})

	t.Run("ids and contexts", func(t *testing.T) {
		m := b.managerOn(t, coll, "a", time.Second, &lease.Options{Clock: b.clock})
		named, err := lease.NewNamed(coll, &lease.Options{TTL: time.Second, Owner: "a", Clock: b.clock, Mode: b.mode})
		require.NoError(t, err)
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		var nilPtr *bson.ObjectID
		for _, mm := range []*lease.Manager{m, named} {
			for _, bad := range []any{nil, "", bson.ObjectID{}, nilPtr} {
				_, err := mm.TryAcquire(ctx, bad)
				require.ErrorIs(t, err, lease.ErrInvalidID, "%#v", bad)
				_, err = mm.Acquire(ctx, bad)
				require.ErrorIs(t, err, lease.ErrInvalidID, "%#v", bad)
				err = mm.Do(ctx, bad, func(context.Context, *lease.Lease) error { panic("not called") })
				require.ErrorIs(t, err, lease.ErrInvalidID, "%#v", bad)
			}
			_, err := mm.TryAcquire(cancelled, id)
			require.ErrorIs(t, err, context.Canceled)
			_, err = mm.Acquire(cancelled, id)
			require.ErrorIs(t, err, context.Canceled)
			err = mm.Do(cancelled, id, func(context.Context, *lease.Lease) error { panic("not called") })
			require.ErrorIs(t, err, context.Canceled)
			require.ErrorIs(t, mm.Do(ctx, id, nil), lease.ErrInvalid)
		}
	})

	require.Zero(t, commands(), "nothing was sent, let alone written")
	require.Equal(t, before, loadRaw(t, b.coll, id))

	t.Run("cancelled renew and release", func(t *testing.T) {
		m := b.managerOn(t, coll, "a", time.Minute, &lease.Options{Clock: b.clock}) // held through the checks below
		l, err := m.TryAcquire(ctx, id)
		require.NoError(t, err)
		held := loadRaw(t, b.coll, id)
		sent := commands()
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		require.ErrorIs(t, l.Renew(cancelled), context.Canceled)
		require.ErrorIs(t, l.Release(cancelled), context.Canceled)
		require.Equal(t, sent, commands(), "nothing was sent")
		require.Equal(t, held, loadRaw(t, b.coll, id))
		require.NoError(t, l.Err(), "still held")
		require.NoError(t, l.Release(ctx))
	})

	t.Run("lease field is not a document", func(t *testing.T) {
		id := bson.NewObjectID()
		_, err := b.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "_lease", Value: 5}})
		require.NoError(t, err)
		m := b.manager(t, "a", time.Second, nil)
		_, err = m.TryAcquire(ctx, id)
		require.Error(t, err)
		require.Equal(t, int32(5), leaseInt32(t, b.coll, id))
	})
}

// leaseInt32 returns the "_lease" field of a document where it is an int32.
func leaseInt32(t *testing.T, coll *mongo.Collection, id any) int32 {
	t.Helper()
	return loadRaw(t, coll, id).Lookup("_lease").Int32()
}

package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/tests/internal/shardtest"
)

// TestShardKeyInEveryFilter drives document leases on a collection with a
// compound shard key, and named leases whose Stamp writes to it, through
// every path that claims, judges, renews, releases, settles or stamps
// (a held lease, a takeover after expiry, Acquire's wait, Do's renewals,
// lost replies), and checks that each command on the leased (or stamped)
// documents filters on the _id and on an equality with each shard-key
// value, and each command on the lock collection on the _id. With
// MONGOCAS_SHARD_KEY set (the sharded-cluster CI job) both collections are
// sharded on the server (the lock collection on hashed _id), and mongos's
// own counts must show no command sent to more than one shard.
func TestShardKeyInEveryFilter(t *testing.T) { eachMode(t, testShardKeyInEveryFilter) }

//nolint:thelper // the body of a test, run once per mode
func testShardKeyInEveryFilter(t *testing.T, mode lease.Mode) {
	ctx := context.Background()
	key := shardtest.ShardKey(t)
	b := setup(t, mode)
	key.Shard(t, b.coll)
	key.ShardByID(t, b.db.Collection("locks"))
	capture, copts := shardtest.NewCapture("docs", "locks")
	f := b.db.Faulty(t, &mongotest.FaultyOptions{ClientOptions: copts})
	docs := f.Collection("docs")
	before := key.ReadTargeting(t, b.db)

	routes := shardtest.Routes{}
	n := 0
	// newDoc inserts a document to lease (not through the captured client)
	// and returns its Key.
	newDoc := func(t *testing.T) lease.Key {
		t.Helper()
		n++
		id := bson.NewObjectID()
		region := shardtest.Regions[n%2]
		_, err := b.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "region", Value: region}, {Key: "accountId", Value: int64(n)}, {Key: "data", Value: "x"}})
		require.NoError(t, err)
		routes[shardtest.RouteOf(t, id)] = key.Values(region, int64(n))
		return lease.Key{ID: id, Shard: key.Values(region, int64(n))}
	}
	checked := 0
	// step checks the commands sent since the last step: each filter on
	// docs routed to its document, each on locks by _id; and that the
	// names in want were sent, at least as often as want says.
	step := func(t *testing.T, want ...string) {
		t.Helper()
		cmds := capture.Take()
		got := map[string]int{}
		for _, c := range cmds {
			got[c.Name]++
		}
		need := map[string]int{}
		for _, w := range want {
			need[w]++
		}
		for w, k := range need {
			require.GreaterOrEqual(t, got[w], k, "%s sent: %v", w, shardtest.Names(cmds))
		}
		if len(want) == 0 {
			require.Empty(t, cmds)
		}
		checked += shardtest.RequireTargeted(t, shardtest.On(cmds, "docs"), routes)
		checked += shardtest.RequireTargeted(t, shardtest.On(cmds, "locks"), nil)
	}
	const long = time.Minute
	opts := func(owner string, ttl time.Duration) *lease.Options {
		return &lease.Options{TTL: ttl, Owner: owner, Mode: mode, Clock: b.clock, ShardKey: key.Fields, Retry: fastRetry}
	}
	manager := func(owner string, ttl time.Duration) *lease.Manager {
		m, err := lease.New(docs, opts(owner, ttl))
		require.NoError(t, err)
		return m
	}
	a, c := manager("a", long), manager("c", long)
	// claim is what a claim sends in this mode; renew what a renewal does.
	read, renew := "find", "update"
	if mode == lease.ModeServer {
		read, renew = "aggregate", "findAndModify"
	}

	t.Run("claim, held, renew, release", func(t *testing.T) {
		k := newDoc(t)
		l, err := a.TryAcquire(ctx, k)
		require.NoError(t, err)
		require.Equal(t, k.ID, l.ID(), "the lease's id is the _id")
		step(t, "findAndModify")
		_, err = c.TryAcquire(ctx, k)
		require.ErrorIs(t, err, lease.ErrHeld)
		step(t, "findAndModify", read)
		require.NoError(t, l.Renew(ctx))
		step(t, renew)
		require.NoError(t, l.Release(ctx))
		step(t, "update")
	})

	t.Run("lost replies", func(t *testing.T) {
		k := newDoc(t)
		claims := mongotest.Commands([]string{"findAndModify"}, "docs")
		fault := f.DropNextReply(claims)
		l, err := a.TryAcquire(ctx, k)
		require.NoError(t, err, "the re-read finds the claim applied")
		require.True(t, fault.HasFired())
		step(t, "findAndModify", read)

		fault = f.DropNextReply(mongotest.Commands([]string{renew}, "docs"))
		require.NoError(t, l.Renew(ctx))
		require.True(t, fault.HasFired())
		step(t, renew, read)

		fault = f.ErrorAfterApply(mongotest.Commands([]string{"update"}, "docs"), mongotest.NotWritablePrimary())
		require.NoError(t, l.Release(ctx))
		require.True(t, fault.HasFired())
		step(t, "update", "find")

		// A claim that never arrived: the re-read shows it did not apply,
		// Acquire claims again.
		fault = f.ErrorBeforeApply(claims, mongotest.NotWritablePrimary())
		l, err = a.Acquire(ctx, k)
		require.NoError(t, err)
		require.True(t, fault.HasFired())
		step(t, "findAndModify", read, "findAndModify")
		require.NoError(t, l.Release(ctx))
		step(t, "update")
	})

	t.Run("takeover after expiry", func(t *testing.T) {
		const ttl = 400 * time.Millisecond
		k := newDoc(t)
		short := manager("s", ttl)
		l, err := short.TryAcquire(ctx, k)
		require.NoError(t, err)
		<-l.Done() // the local deadline passed
		time.Sleep(ttl)
		lc, err := c.TryAcquire(ctx, k)
		require.NoError(t, err, "expired: c takes it over")
		require.ErrorIs(t, l.Release(ctx), lease.ErrLost)
		step(t, "findAndModify", "findAndModify")
		require.NoError(t, lc.Release(ctx))
		step(t, "update")

		// A renewal, or a release, that finds the record changed under it
		// reads the record to say what became of the lease.
		for _, end := range []struct {
			call func(l *lease.Lease, ctx context.Context) error
			read string
		}{{(*lease.Lease).Renew, read}, {(*lease.Lease).Release, "find"}} {
			k := newDoc(t)
			l, err := a.TryAcquire(ctx, k)
			require.NoError(t, err)
			step(t, "findAndModify")
			_, err = b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: k.ID}}, k.Shard...), bson.D{{Key: "$set", Value: bson.D{{Key: "_lease.owner", Value: "intruder"}}}})
			require.NoError(t, err)
			require.ErrorIs(t, end.call(l, ctx), lease.ErrLost)
			step(t, end.read)
		}
	})

	t.Run("acquire waits, do renews", func(t *testing.T) {
		k := newDoc(t)
		l, err := a.TryAcquire(ctx, k)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			time.Sleep(100 * time.Millisecond)
			done <- l.Release(ctx)
		}()
		lc, err := c.Acquire(ctx, k)
		require.NoError(t, err)
		require.NoError(t, <-done)
		require.NoError(t, lc.Release(ctx))
		step(t, "findAndModify", "findAndModify", read, "update", "update")

		// Renewals a second apart on a 3 s lease: one lands before the
		// function ends, and a busy machine neither loses the lease nor
		// fits a second renewal in.
		o := opts("d", 3*time.Second)
		o.RenewEvery = time.Second
		d, err := lease.New(docs, o)
		require.NoError(t, err)
		renewed := 0
		require.NoError(t, d.Do(ctx, k, func(ctx context.Context, l *lease.Lease) error {
			first := l.ExpiresAt()
			for l.ExpiresAt().Equal(first) {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(10 * time.Millisecond):
				}
			}
			renewed++
			return nil
		}))
		require.Equal(t, 1, renewed)
		step(t, "findAndModify", renew, "update")
	})

	t.Run("named lease stamps a sharded document", func(t *testing.T) {
		named, err := lease.NewNamed(f.Collection("locks"), opts("n", long))
		require.NoError(t, err)
		l, err := named.TryAcquire(ctx, "partner-api:user:42")
		require.NoError(t, err)
		step(t, "findAndModify")
		k := newDoc(t)
		require.NoError(t, l.Stamp(ctx, docs, k))
		step(t, "update")
		fault := f.DropNextReply(mongotest.Commands([]string{"update"}, "docs"))
		require.NoError(t, l.Stamp(ctx, docs, k), "the re-read shows the stamp")
		require.True(t, fault.HasFired())
		step(t, "update", "find")

		require.ErrorIs(t, l.Stamp(ctx, docs, k.ID), lease.ErrInvalidID, "a bare id where a shard key is configured")
		_, err = named.TryAcquire(ctx, k)
		require.ErrorIs(t, err, lease.ErrInvalidID, "a lock document is found by its name alone")
		step(t)
		require.NoError(t, l.Release(ctx))
		step(t, "update")
	})

	t.Run("refused before anything is sent", func(t *testing.T) {
		k := newDoc(t)
		_, err := a.TryAcquire(ctx, k.ID)
		require.ErrorIs(t, err, lease.ErrInvalidID, "a bare id where a shard key is configured")
		err = a.Do(ctx, k.ID, func(context.Context, *lease.Lease) error { return nil })
		require.ErrorIs(t, err, lease.ErrInvalidID)
		bad := lease.Key{ID: k.ID, Shard: bson.D{{Key: key.Fields[0], Value: bson.D{{Key: "$gt", Value: ""}}}}}
		_, err = a.Acquire(ctx, bad)
		require.ErrorIs(t, err, lease.ErrInvalidID, "an operator as a shard-key value")
		step(t)

		for _, field := range []string{"_lease.owner", "_fence", "a..b", "$where"} {
			_, err = lease.New(docs, &lease.Options{ShardKey: []string{field}, TTL: long})
			require.ErrorIs(t, err, lease.ErrInvalid, field)
		}
	})

	require.Greater(t, checked, 25, "filters checked")
	shardtest.RequireOneShard(t, before, key.ReadTargeting(t, b.db))
}

package lease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/tests/internal/stress"
)

func (b *bundle) named(t *testing.T, locks *mongo.Collection, owner string, ttl time.Duration, opts *lease.Options) *lease.Manager {
	t.Helper()
	o := lease.Options{}
	if opts != nil {
		o = *opts
	}
	o.Owner, o.TTL, o.Clock = owner, ttl, b.clock
	if o.Mode == lease.ModeAuto {
		o.Mode = b.mode
	}
	m, err := lease.NewNamed(locks, &o)
	require.NoError(t, err)
	return m
}

func TestNamed(t *testing.T) { eachMode(t, testNamed) }

//nolint:thelper // the body of a test, run once per mode
func testNamed(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	locks := b.db.Collection("locks")
	a := b.named(t, locks, "a", time.Minute, nil)
	c := b.named(t, locks, "c", time.Minute, nil)
	const name = "partner-api:user:42"

	la, err := a.TryAcquire(ctx, name)
	require.NoError(t, err, "the first claim creates the lock document")
	// A new lock document's first epoch is the server's time in µs: above
	// every epoch of an earlier document of that name, deleted by clean-up.
	first := la.Epoch()
	require.Greater(t, first, time.Now().Add(-time.Hour).UnixMicro())
	d := load(t, locks, name)
	require.Equal(t, "a", owner(d.Lease))

	_, err = c.TryAcquire(ctx, name)
	require.ErrorIs(t, err, lease.ErrHeld)
	var held *lease.HeldError
	require.ErrorAs(t, err, &held)
	require.Equal(t, "a", held.Owner)
	require.Equal(t, name, held.ID)

	require.NoError(t, la.Release(ctx))
	d = load(t, locks, name)
	require.Empty(t, owner(d.Lease), "released")
	require.Equal(t, first, d.Lease.Epoch, "the lock document stays, with its epoch")
	require.NotNil(t, d.Lease.ExpiresAt, "it keeps the time of release, for the clean-up")
	require.False(t, d.Lease.ExpiresAt.After(time.Now().Add(time.Second)))

	err = c.Do(ctx, name, func(ctx context.Context, l *lease.Lease) error {
		require.Equal(t, first+1, l.Epoch())
		return nil
	})
	require.NoError(t, err)
	n, err := locks.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

// TestNamedRace: 32 owners race for fresh names, so the upsert itself races
// and all but one lose on the duplicate _id: exactly one winner per round,
// every other owner gets ErrHeld.
func TestNamedRace(t *testing.T) { eachMode(t, testNamedRace) }

//nolint:thelper // the body of a test, run once per mode
func testNamedRace(t *testing.T, mode lease.Mode) {
	const goroutines = 32
	rounds := stress.Pick(15, 30) // MONGOCAS_STRESS=1: 30
	b := setup(t, mode)
	ctx := context.Background()
	locks := b.db.Collection("locks")
	managers := make([]*lease.Manager, goroutines)
	for i := range managers {
		managers[i] = b.named(t, locks, fmt.Sprintf("owner-%02d", i), time.Minute, nil)
	}
	for round := range rounds {
		name := fmt.Sprintf("job:%d", round)
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, goroutines)
		leases := make([]*lease.Lease, goroutines)
		for i, m := range managers {
			wg.Go(func() {
				<-start
				leases[i], errs[i] = m.TryAcquire(ctx, name)
			})
		}
		close(start)
		wg.Wait()
		winners := 0
		var winner *lease.Lease
		for i, err := range errs {
			if err == nil {
				winners++
				winner = leases[i]
				continue
			}
			require.ErrorIs(t, err, lease.ErrHeld, "round %d owner %d", round, i)
		}
		require.Equal(t, 1, winners, "round %d", round)
		require.Equal(t, winner.Epoch(), load(t, locks, name).Lease.Epoch, "one claim applied")
	}
}

func TestCleanup(t *testing.T) { eachMode(t, testCleanup) }

//nolint:thelper // the body of a test, run once per mode
func testCleanup(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	locks := b.db.Collection("locks")
	// m's claims must be applied within its deadline (0.9 TTL), on a loaded
	// machine too.
	m := b.named(t, locks, "a", time.Second, &lease.Options{CleanupAfter: 50 * time.Millisecond})
	// long: leases that stay held, through any delay before the Sweep.
	long := b.named(t, locks, "b", time.Minute, &lease.Options{CleanupAfter: 50 * time.Millisecond})

	ttl, err := m.EnsureIndexes(ctx)
	require.NoError(t, err)
	require.Equal(t, b.db.Caps().TTLIndexes, ttl, "a TTL index exactly where the server has them")
	specs, err := locks.Indexes().ListSpecifications(ctx)
	require.NoError(t, err)
	found := false
	for _, s := range specs {
		if s.Name == lease.TTLIndexName("_lease") {
			found = true
			require.NotNil(t, s.ExpireAfterSeconds)
		}
	}
	require.Equal(t, ttl, found)

	released, err := long.TryAcquire(ctx, "released")
	require.NoError(t, err)
	require.NoError(t, released.Release(ctx))
	_, err = m.TryAcquire(ctx, "crashed") // never released
	require.NoError(t, err)
	time.Sleep(1200 * time.Millisecond) // past the crashed lease's TTL + CleanupAfter
	live, err := long.TryAcquire(ctx, "live")
	require.NoError(t, err)

	n, err := m.Sweep(ctx)
	require.NoError(t, err)
	if ttl {
		// The TTL monitor may have deleted some already.
		require.LessOrEqual(t, n, 2, "the released and the crashed lock documents")
	} else {
		require.Equal(t, 2, n, "the released and the crashed lock documents")
	}
	left, err := locks.Distinct(ctx, "_id", bson.D{}).Raw()
	require.NoError(t, err)
	require.Contains(t, left.String(), `"live"`)
	require.NotContains(t, left.String(), `"crashed"`)
	require.NotContains(t, left.String(), `"released"`)
	require.NoError(t, live.Release(ctx))

	docs := b.manager(t, "a", time.Second, nil)
	_, err = docs.EnsureIndexes(ctx)
	require.ErrorIs(t, err, lease.ErrNotNamed)
	_, err = docs.Sweep(ctx)
	require.ErrorIs(t, err, lease.ErrNotNamed)
}

// TestTTLIndex runs where the server has TTL indexes: the index deletes a
// stale lock document by itself.
func TestTTLIndex(t *testing.T) { eachMode(t, testTTLIndex) }

//nolint:thelper // the body of a test, run once per mode
func testTTLIndex(t *testing.T, mode lease.Mode) {
	mongotest.Use(t, mongotest.TTLIndexes)
	b := setup(t, mode)
	ctx := context.Background()
	locks := b.db.Collection("locks")
	m := b.named(t, locks, "a", time.Minute, &lease.Options{CleanupAfter: time.Second})
	ok, err := m.EnsureIndexes(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	l, err := m.TryAcquire(ctx, "stale")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	// MongoDB's TTL monitor runs every 60s.
	require.Eventually(t, func() bool {
		n, err := locks.CountDocuments(ctx, bson.D{})
		return err == nil && n == 0
	}, 3*time.Minute, time.Second)
}

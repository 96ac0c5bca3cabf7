package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// probeCount counts the commands that find out about a server: hello,
// buildInfo, and every command on the probe's scratch collection.
type probeCount struct {
	mu                      sync.Mutex
	hello, buildInfo, probe int
}

func (c *probeCount) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		c.mu.Lock()
		defer c.mu.Unlock()
		switch e.CommandName {
		case "hello":
			c.hello++
		case "buildInfo":
			c.buildInfo++
		}
		if coll, ok := e.Command.Lookup(e.CommandName).StringValueOK(); ok && strings.HasPrefix(coll, store.ProbeCollection) {
			c.probe++
		}
	}}
}

func (c *probeCount) get() (hello, buildInfo, probe int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hello, c.buildInfo, c.probe
}

// monitoredDB returns db's database on a fresh client (so with a fresh
// store.Server) whose commands c counts.
func monitoredDB(t *testing.T, db *mongotest.DB, c *probeCount) *mongotest.Faulty {
	t.Helper()
	return db.Faulty(t, &mongotest.FaultyOptions{ClientOptions: options.Client().SetMonitor(c.monitor())})
}

type stock struct {
	ID      string `bson:"_id"`
	N       int64  `bson:"n"`
	Version int64  `bson:"version"`
}

// Every package made on one client asks that client's store.Server: however
// many repositories, lease managers, queues and key sets there are, the
// server is probed once (one buildInfo, the scratch commands of one Probe)
// and its clock is synced once (hello: one for the probe, Samples for the
// shared clock's one sync, on servers that need the estimate).
func TestProbeOncePerClient(t *testing.T) {
	db := mongotest.New(t)
	ctx := t.Context()

	// What one Probe costs on this server, on a client of its own.
	var one probeCount
	_, err := store.Probe(ctx, monitoredDB(t, db, &one).Database)
	require.NoError(t, err)
	_, oneBuild, oneProbe := one.get()
	require.Equal(t, 1, oneBuild)
	require.Positive(t, oneProbe)

	var all probeCount
	f := monitoredDB(t, db, &all)
	const n = 4
	var wg sync.WaitGroup
	errs := make(chan error, 16*n)
	run := func(fn func() error) {
		wg.Go(func() {
			if err := fn(); err != nil {
				errs <- err
			}
		})
	}
	for i := range n {
		run(func() error { // a repository's first CAS write asks the kind of server
			repo, err := versioned.New[stock](f.Collection(fmt.Sprintf("repo%d", i)), nil)
			if err != nil {
				return err
			}
			doc := &stock{ID: "a"}
			if err := repo.Insert(ctx, doc); err != nil {
				return err
			}
			_, err = repo.Modify(ctx, "a", func(s *stock) error { s.N++; return nil })
			return err
		})
		run(func() error { // a manager's mode, TTL index and first claim
			m, err := lease.NewNamed(f.Collection(fmt.Sprintf("locks%d", i)), nil)
			if err != nil {
				return err
			}
			if _, err := m.EnsureIndexes(ctx); err != nil {
				return err
			}
			l, err := m.TryAcquire(ctx, "name")
			if err != nil {
				return err
			}
			return l.Release(ctx)
		})
		run(func() error { // a queue's indexes and first enqueue
			q, err := deferred.New(f.Collection(fmt.Sprintf("jobs%d", i)), nil)
			if err != nil {
				return err
			}
			if _, err := deferred.Register(q, "noop", func(context.Context, *deferred.Job, struct{}) error { return nil }); err != nil {
				return err
			}
			_, err = q.Enqueue(ctx, "noop", "k", struct{}{})
			return err
		})
		run(func() error { // a key set's index and first request
			k, err := idempotency.New(f.Collection(fmt.Sprintf("keys%d", i)), nil)
			if err != nil {
				return err
			}
			if _, err := k.EnsureIndexes(ctx); err != nil {
				return err
			}
			_, err = k.Do(ctx, "key", nil, func(context.Context, *idempotency.Call) (idempotency.Result, error) {
				return idempotency.Result{Status: 200}, nil
			})
			return err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	hello, build, probe := all.get()
	t.Logf("hello %d, buildInfo %d, probe commands %d (one Probe: %d)", hello, build, probe, oneProbe)
	require.Equal(t, 1, build, "buildInfo once per client")
	require.Equal(t, oneProbe, probe, "the scratch commands of one Probe per client")
	require.LessOrEqual(t, hello, 1+3, "one hello for the probe, and one sync of the shared clock (3 samples)")
	first := store.For(f.Client).Clock()
	require.Same(t, first, store.For(f.Client).Clock(), "one server clock per client")
}

// A probe that fails is not kept: the next caller probes again, and then
// the answer is kept.
func TestFailedProbeIsRetried(t *testing.T) {
	db := mongotest.New(t)
	ctx := t.Context()
	var c probeCount
	f := monitoredDB(t, db, &c)
	fault := f.ErrorBeforeApply(func(c *mongotest.Command) bool {
		return c.Name == "insert" && strings.HasPrefix(c.Collection, store.ProbeCollection)
	}, mongotest.NotWritablePrimary())

	m, err := lease.NewNamed(f.Collection("locks"), nil)
	require.NoError(t, err)
	_, err = m.Mode(ctx)
	require.Error(t, err, "the probe's scratch insert was refused")
	require.True(t, fault.HasFired())
	_, _, before := c.get()

	mode, err := m.Mode(ctx)
	require.NoError(t, err)
	caps, err := store.For(f.Client).Capabilities(ctx, f.Database)
	require.NoError(t, err)
	require.Equal(t, db.Caps().Expr && db.Caps().UpdatePipelines, mode == lease.ModeServer)
	require.Equal(t, db.Caps(), caps)
	_, build, after := c.get()
	require.Equal(t, 1, build, "hello and buildInfo succeeded the first time: kept")
	require.Greater(t, after, before, "probed again")

	// Kept now: nothing more is sent.
	_, err = m.EnsureIndexes(ctx)
	require.NoError(t, err)
	_, _, last := c.get()
	require.Equal(t, after, last)
}

// A caller that waits for another's probe waits with its own context, and
// when that probe failed (there: its caller's context ended) it probes
// itself.
func TestProbeWaitersKeepTheirContext(t *testing.T) {
	db := mongotest.New(t)
	var c probeCount
	f := monitoredDB(t, db, &c)
	srv := store.For(f.Client)
	stop := f.DelayReplies(300*time.Millisecond, mongotest.Commands([]string{"buildInfo"}))

	short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	first := make(chan error, 1)
	go func() { _, err := srv.Capabilities(short, f.Database); first <- err }()
	time.Sleep(20 * time.Millisecond)
	caps, err := srv.Capabilities(t.Context(), f.Database)
	stop()
	require.NoError(t, err)
	require.ErrorIs(t, <-first, context.DeadlineExceeded)
	require.Equal(t, db.Caps(), caps)

	// A session in the context is not used: the probe runs outside it.
	sess, err := f.Client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(context.Background())
	kind, err := srv.Kind(mongo.NewSessionContext(t.Context(), sess))
	require.NoError(t, err)
	require.Equal(t, caps.Server, kind)
}

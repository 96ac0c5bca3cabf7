package lease_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
)

// Contenders for one lease in one process wait in line and get it in turn
// when the holder's lease ends, instead of polling the database: every
// acquisition is one claim that succeeds.

func TestLineOneClaimPerAcquisition(t *testing.T) { eachMode(t, testLineOneClaimPerAcquisition) }

// testLineOneClaimPerAcquisition: 8 goroutines, on two Managers of
// different owners on one collection of one client, run Do 12 times each
// on one document, with a 3ms critical section. No two critical sections
// overlap, epochs rise in the order of the critical sections, and exactly
// one claim is sent per Do: nobody polled a held lease.
func testLineOneClaimPerAcquisition(t *testing.T, mode lease.Mode) {
	t.Helper()
	const workers, each = 8, 12
	b := setup(t, mode)
	var claims atomic.Int64
	mon := &event.CommandMonitor{Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) {
		if e.CommandName == "findAndModify" {
			claims.Add(1)
		}
	}}
	f := b.db.Faulty(t, &mongotest.FaultyOptions{ClientOptions: options.Client().SetMonitor(mon)})
	coll := f.Collection(b.coll.Name())
	id := b.insert(t)
	ms := []*lease.Manager{
		b.managerOn(t, coll, "alpha", time.Minute, nil),
		b.managerOn(t, coll, "beta", time.Minute, nil),
	}
	ctx := context.Background()
	// The first claim of a record (no epoch yet) takes more than one
	// command in ModeEstimated; count from a record that has one.
	require.NoError(t, ms[0].Do(ctx, id, func(context.Context, *lease.Lease) error { return nil }))
	claims.Store(0)

	var (
		inside  atomic.Int32
		mu      sync.Mutex
		epochs  []int64
		waits   []time.Duration
		perWork = make([]int, workers)
		wg      sync.WaitGroup
	)
	for w := range workers {
		m := ms[w%len(ms)]
		wg.Go(func() {
			for range each {
				asked := time.Now()
				err := m.Do(ctx, id, func(_ context.Context, l *lease.Lease) error {
					wait := time.Since(asked)
					if !inside.CompareAndSwap(0, 1) {
						return errors.New("two holders at once")
					}
					mu.Lock()
					epochs = append(epochs, l.Epoch())
					waits = append(waits, wait)
					perWork[w]++
					mu.Unlock()
					time.Sleep(3 * time.Millisecond)
					inside.Store(0)
					return nil
				})
				if err != nil {
					t.Errorf("do: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.Len(t, epochs, workers*each)
	require.True(t, slices.IsSorted(epochs), "epochs rise in the order of the critical sections")
	require.Len(t, slices.Compact(slices.Clone(epochs)), workers*each, "every acquisition has an epoch of its own")
	require.Equal(t, int64(workers*each), claims.Load(), "one claim per acquisition: nobody polled")
	slices.Sort(waits)
	t.Logf("%s: wait p50 %v, p99 %v, max %v; work per worker %v", mode, waits[len(waits)/2], waits[len(waits)*99/100], waits[len(waits)-1], perWork)
}

func TestLineWaiterLeaves(t *testing.T) { eachMode(t, testLineWaiterLeaves) }

// testLineWaiterLeaves: calls waiting in line whose context ends leave it
// with their context's error and claim nothing; the calls behind them get
// the lease in turn.
func testLineWaiterLeaves(t *testing.T, mode lease.Mode) {
	t.Helper()
	b := setup(t, mode)
	id := b.insert(t)
	m := b.manager(t, "alpha", time.Minute, nil)
	ctx := context.Background()
	held, err := m.Acquire(ctx, id)
	require.NoError(t, err)

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	gone := make(chan error, 1)
	go func() {
		_, err := m.Acquire(short, id)
		gone <- err
	}()
	next := make(chan *lease.Lease, 1)
	go func() {
		l, err := m.Acquire(ctx, id)
		if err != nil {
			t.Errorf("acquire: %v", err)
		}
		next <- l
	}()
	require.ErrorIs(t, <-gone, context.DeadlineExceeded)
	select {
	case <-next:
		t.Fatal("the lease was handed on while held")
	default:
	}
	require.NoError(t, held.Release(ctx))
	l := <-next
	require.NotNil(t, l)
	require.Greater(t, l.Epoch(), held.Epoch())
	require.NoError(t, l.Release(ctx))
}

func TestLineNotForOneAttempt(t *testing.T) { eachMode(t, testLineNotForOneAttempt) }

// testLineNotForOneAttempt: a Manager whose policy makes one attempt
// (Retry.MaxAttempts 1, as the idempotency package configures) does not
// wait in line: inside Do, an Acquire and a Do of the same lease through
// the same Manager, and through another Manager on the same collection of
// the same client, answer a *HeldError naming the holder at once. (Waiting
// in line, they would wait for the Do they run inside: the test would hang.)
// Once the lease is released, an Acquire gets it with its one claim.
func testLineNotForOneAttempt(t *testing.T, mode lease.Mode) {
	t.Helper()
	b := setup(t, mode)
	id := b.insert(t)
	once := &lease.Options{Retry: retry.Policy{MaxAttempts: 1}}
	m := b.manager(t, "alpha", time.Minute, once)
	other := b.manager(t, "beta", time.Minute, once)
	ctx := context.Background()
	var epoch int64
	require.NoError(t, m.Do(ctx, id, func(ctx context.Context, l *lease.Lease) error {
		epoch = l.Epoch()
		for _, c := range []*lease.Manager{m, other} {
			_, err := c.Acquire(ctx, id)
			var held *lease.HeldError
			require.ErrorAs(t, err, &held, "%s's Acquire", c.Owner())
			require.Equal(t, "alpha", held.Owner)
			require.Equal(t, epoch, held.Epoch)
			err = c.Do(ctx, id, func(context.Context, *lease.Lease) error {
				t.Error("ran under a lease it could not hold")
				return nil
			})
			require.ErrorIs(t, err, lease.ErrHeld, "%s's Do", c.Owner())
		}
		return nil
	}))
	l, err := other.Acquire(ctx, id)
	require.NoError(t, err, "released: one claim gets it")
	require.Greater(t, l.Epoch(), epoch)
	require.NoError(t, l.Release(ctx))
}

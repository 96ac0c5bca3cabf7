package lease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/tests/internal/stress"
)

// TestRace: 32 goroutines, each its own owner, race for one lease in each of
// 50 rounds (200 with MONGOCAS_STRESS=1); the winner releases it at the end of its round. Exactly one
// wins every round, exactly one claim is applied (the epoch rises by one),
// and every loser gets ErrHeld naming the winner.
//
// The rounds share one document: FerretDB v1 scans the whole collection for
// a filter other than a bare _id, so a growing collection would only slow the
// test down.
func TestRace(t *testing.T) { eachMode(t, testRace) }

//nolint:thelper // the body of a test, run once per mode
func testRace(t *testing.T, mode lease.Mode) {
	// 50 rounds prove one winner per round; MONGOCAS_STRESS=1 runs 200.
	const goroutines = 32
	rounds := stress.Pick(50, 200)
	b := setup(t, mode)
	ctx := context.Background()
	managers := make([]*lease.Manager, goroutines)
	for i := range managers {
		managers[i] = b.manager(t, fmt.Sprintf("owner-%02d", i), time.Minute, nil)
	}
	id := b.insert(t)
	var first int64 // the first round's epoch
	for round := range rounds {
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			leases  = make([]*lease.Lease, goroutines)
			errs    = make([]error, goroutines)
			winners int
			winner  *lease.Lease
		)
		for i, m := range managers {
			wg.Go(func() {
				<-start
				leases[i], errs[i] = m.TryAcquire(ctx, id)
			})
		}
		close(start)
		wg.Wait()
		for i := range goroutines {
			if errs[i] == nil {
				winners++
				winner = leases[i]
			}
		}
		require.Equal(t, 1, winners, "round %d: exactly one winner", round)
		if round == 0 {
			first = winner.Epoch()
		}
		epoch := first + int64(round)
		require.Equal(t, epoch, winner.Epoch(), "round %d", round)
		for i := range goroutines {
			if errs[i] == nil {
				continue
			}
			require.ErrorIs(t, errs[i], lease.ErrHeld, "round %d owner %d", round, i)
			var held *lease.HeldError
			require.ErrorAs(t, errs[i], &held)
			require.Equal(t, winner.Owner(), held.Owner, "round %d owner %d", round, i)
			require.Equal(t, epoch, held.Epoch, "round %d owner %d", round, i)
		}
		d := load(t, b.coll, id)
		require.Equal(t, winner.Owner(), owner(d.Lease), "round %d", round)
		require.Equal(t, epoch, d.Lease.Epoch, "round %d: one claim applied", round)
		require.NoError(t, winner.Release(ctx))
	}
}

// TestEpochs: several owners take turns on one document through 300 (1,000
// with MONGOCAS_STRESS=1)
// acquire/release cycles. In the order the lease was held, every epoch is
// greater than every earlier one, and fenced writes count the cycles exactly.
func TestEpochs(t *testing.T) { eachMode(t, testEpochs) }

//nolint:thelper // the body of a test, run once per mode
func testEpochs(t *testing.T, mode lease.Mode) {
	const owners = 4
	cycles := stress.Pick(300, 1000) // MONGOCAS_STRESS=1: 1,000
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	var (
		mu     sync.Mutex
		epochs []int64
		wg     sync.WaitGroup
		errs   = make(chan error, owners)
	)
	for i := range owners {
		m := b.manager(t, fmt.Sprintf("owner-%d", i), time.Minute, &lease.Options{Retry: fastRetry})
		wg.Go(func() {
			for range cycles / owners {
				l, err := m.Acquire(ctx, id)
				if err != nil {
					errs <- err
					return
				}
				// Appended while held, so in the order the lease was held.
				mu.Lock()
				epochs = append(epochs, l.Epoch())
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, epochs, cycles)
	for i := 1; i < len(epochs); i++ {
		require.Greater(t, epochs[i], epochs[i-1], "epoch %d after %d", epochs[i], epochs[i-1])
	}
	require.Equal(t, epochs[0]+int64(cycles-1), epochs[len(epochs)-1], "no claim was lost or doubled")
	d := load(t, b.coll, id)
	require.Equal(t, epochs[len(epochs)-1], d.Lease.Epoch)
	require.Empty(t, owner(d.Lease))
}

package move_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/tests/internal/stress"
	"github.com/mongocas/mongocas/versioned"
)

// placed is one order of the orders test and what MoveAll answered to
// each try of it.
type placed struct {
	id    string
	steps []move.Step
	tries []try
}

type try struct {
	saga move.Saga
	err  error
}

// TestOrdersOfManyItemsAreAllOrNothing places 200 orders at once, each of
// 3 distinct items out of 10 with limited stock, from three processes
// (each its own client behind a fault proxy, its own queue worker), with
// replies dropped and copies held and delivered late, and one process cut
// off mid-run. Sampled every 100 ms, the stock plus the orders plus the
// pending entries is the starting stock. At the end, after the relay and
// Sweep ran: every order is all or nothing (decided done: it holds every
// item's quantity and each move is Done; returned: it holds nothing), what
// MoveAll answered agrees with the decision, no item is oversold (each
// item's stock is its start minus the quantities of the done orders, and
// not below zero), and no move state is left.
func TestOrdersOfManyItemsAreAllOrNothing(t *testing.T) {
	const (
		items     = 10
		processes = 3
	)
	orders := stress.Pick(40, 200) // MONGOCAS_STRESS=1: 200
	stock := int64(orders / 4)     // 3 items of 1-3 each: demand is about 1.2 times the stock
	b := setup(t)
	ids := make([]any, 0, items+orders)
	itemNames := make([]string, items)
	for i := range items {
		itemNames[i] = fmt.Sprintf("item-%d", i)
		b.insert(t, itemNames[i], stock)
		ids = append(ids, itemNames[i])
	}
	placedOrders := make([]*placed, orders)
	rng := rand.New(rand.NewPCG(37, 37))
	for i := range placedOrders {
		o := &placed{id: fmt.Sprintf("order-%03d", i)}
		b.insert(t, o.id, 0)
		ids = append(ids, o.id)
		for _, k := range rng.Perm(items)[:3] {
			o.steps = append(o.steps, move.Step{From: itemNames[k], To: o.id, Amount: int64(1 + rng.IntN(3))})
		}
		placedOrders[i] = o
	}
	total := int64(items) * stock
	opts := func() *move.Options {
		return &move.Options{Field: "balance", Grace: 2 * time.Second,
			Outcomes: b.db.Collection("accounts_moves"),
			Repo:     &versioned.Options{ResolveTimeout: 2 * time.Second},
			// 200 sagas at once on one slow server: a step's first try
			// may wait seconds for its turn; a fault clears the pool.
			Retry: retry.Policy{MaxElapsedTime: 30 * time.Second}}
	}
	jobs := b.queue(t, nil) // never run: its Counts say what the relays have left to do
	obs := b.mover(t, jobs, nil, opts())
	procs := b.processes(t, processes, opts)

	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	var background sync.WaitGroup
	held := faults(ctx, &background, procs, time.Second, []string{"debit", "prepare", "decide", "credit", "finish", "record", "clean"})
	samples, unstable := sample(ctx, t, &background, obs, ids, total)

	started := time.Now()
	var answered, logged atomic.Int64
	var wg sync.WaitGroup
	for i, o := range placedOrders {
		p := procs[i%processes]
		wg.Go(func() {
			defer answered.Add(1)
			// An order refused because an item was short is tried again
			// a few times, as a shop would: the stock may have been held
			// by sagas that then aborted and returned it.
			for n := range 3 {
				saga, err := p.m.MoveAll(context.Background(), o.steps)
				o.tries = append(o.tries, try{saga, err})
				if errors.Is(err, move.ErrInvalid) {
					t.Errorf("MoveAll: %v", err)
				}
				if !errors.Is(err, versioned.ErrGuardFailed) || !p.alive.Load() {
					if err != nil && logged.Add(1) <= 5 {
						t.Logf("MoveAll: %v", err)
					}
					return
				}
				time.Sleep(time.Duration(50+rand.IntN(100<<n)) * time.Millisecond)
			}
		})
	}
	// Process 1 is cut off once a quarter of the orders were answered.
	require.Eventually(t, func() bool { return answered.Load() >= int64(orders/4) }, 5*time.Minute, 10*time.Millisecond)
	procs[1].cutOff()
	wg.Wait()
	cancel()
	background.Wait()
	held.deliverAll()
	answeredIn := time.Since(started)
	b.settleAll(t, obs, jobs)
	t.Logf("answered in %v, settled %v later", answeredIn.Round(time.Second), (time.Since(started) - answeredIn).Round(time.Second))

	want := map[string]int64{}
	for _, n := range itemNames {
		want[n] = stock
	}
	var done, returned, undecided, short, tries int
	for _, o := range placedOrders {
		var reserved int64
		for _, s := range o.steps {
			reserved += s.Amount
		}
		doneTries := 0
		for _, tr := range o.tries {
			tries++
			switch st := sagaOutcome(t, b, obs, o, tr); st {
			case move.Done:
				done++
				doneTries++
				for _, s := range o.steps {
					item, _ := s.From.(string)
					want[item] -= s.Amount
				}
			case move.Returned:
				returned++
				if errors.Is(tr.err, versioned.ErrGuardFailed) {
					short++
				}
			default:
				undecided++
			}
		}
		require.LessOrEqual(t, doneTries, 1, "%s was placed twice", o.id)
		require.Equal(t, reserved*int64(doneTries), b.balance(t, o.id), "%s holds part of its items", o.id)
	}
	var left int64
	for id, n := range want {
		got := b.balance(t, id)
		left += got
		require.Equal(t, n, got, "stock of %s", id)
		require.GreaterOrEqual(t, got, int64(0), "%s oversold", id)
	}
	t.Logf("%d orders, %d tries: %d done, %d returned (%d for an item short), %d undecided (nothing moved); stock left %d of %d; %d samples, %d unstable; %d held copies",
		orders, tries, done, returned, short, undecided, left, total, samples.Load(), unstable.Load(), held.count())
	s, err := obs.Sum(b.ctx, ids...)
	require.NoError(t, err)
	require.Equal(t, total, s.Sum)
	require.Positive(t, done)
	require.Positive(t, short, "no order found an item short: the stock limit was not tested")
}

// sagaOutcome checks one try of an order against what the relay left, and
// returns its decision ("" if undecided): what MoveAll answered agrees with
// the decision, and each move's status with the saga's.
func sagaOutcome(t *testing.T, b *bundle, obs *move.Mover, o *placed, tr try) move.Status {
	t.Helper()
	st, err := obs.SagaStatus(b.ctx, tr.saga.ID)
	if errors.Is(err, move.ErrNotFound) {
		// Undecided: MoveAll's process was cut off before any debit
		// landed and before its decision; nothing may have moved.
		require.Error(t, tr.err, "%s: MoveAll said done but nothing is decided", o.id)
		for i, id := range tr.saga.Moves {
			_, err := obs.Status(b.ctx, o.steps[i].From, id)
			require.ErrorIs(t, err, move.ErrNotFound, "%s step %d of an undecided saga", o.id, i)
		}
		return ""
	}
	require.NoError(t, err, o.id)
	switch {
	case tr.err == nil:
		require.Equal(t, move.Done, st, "%s: MoveAll said done", o.id)
	case errors.Is(tr.err, move.ErrAborted):
		require.Equal(t, move.Returned, st, "%s: MoveAll said aborted: %v", o.id, tr.err)
	}
	for i, id := range tr.saga.Moves {
		s, err := obs.Status(b.ctx, o.steps[i].From, id)
		if st == move.Returned && errors.Is(err, move.ErrNotFound) {
			continue // its debit never landed
		}
		require.NoError(t, err, "%s step %d", o.id, i)
		require.Equal(t, st, s, "%s step %d", o.id, i)
	}
	require.Contains(t, []move.Status{move.Done, move.Returned}, st, o.id)
	return st
}

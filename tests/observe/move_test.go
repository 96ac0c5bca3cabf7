package observe_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/observe"
)

// TestMoveEvents: a move that is credited and one whose target refuses it
// report their debit (from Move, in the caller's context) and their
// settlement (from the relay), once each, with the move's id, ends, amount
// and time in flight; the Mover's Observer also gets the repository's
// operations; Counters and the slog Observer count and log them (a return
// at Info, the rest at Debug).
func TestMoveEvents(t *testing.T) {
	db := mongotest.New(t)
	ctx := t.Context()
	rec := &recorder{}
	counters := &observe.Counters{}
	var logged bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelInfo}))
	q, m := accountsMover(t, db, observe.Join(rec, counters, observe.Slog(logger)))

	done, err := m.Move(ctx, "ana", "ben", 30, nil)
	require.NoError(t, err)
	returned, err := m.Move(ctx, "ana", "shut", 5, nil)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = q.Run(runCtx) })
	defer func() { stop(); wg.Wait() }()
	for id, want := range map[bson.ObjectID]move.Status{done: move.Done, returned: move.Returned} {
		waitFor(t, func() bool {
			st, err := m.Status(ctx, "ana", id)
			return err == nil && st == want
		})
	}
	// The settlement is reported after the write Status saw.
	waitFor(t, func() bool { return counters.Count(observe.MoveDone)+counters.Count(observe.MoveReturned) == 2 })

	lines := func(id bson.ObjectID) []string {
		var out []string
		for _, e := range rec.all() {
			if e.ID != id || !strings.HasPrefix(e.Kind.String(), "move.") {
				continue
			}
			require.Equal(t, db.Name(), e.Database)
			require.Equal(t, "accounts", e.Collection)
			if e.Kind == observe.MoveDebited {
				require.Zero(t, e.Age)
			} else {
				require.Positive(t, e.Age, "time in flight")
				require.Less(t, e.Age, time.Minute)
			}
			out = append(out, fmt.Sprintf("%s %s from=%s to=%s amount=%d", e.Kind, e.Op, e.From, e.To, e.Amount))
		}
		return out
	}
	requireLines(t, []string{
		`move.debited move from="ana" to="ben" amount=30`,
		`move.done relay from="ana" to="ben" amount=30`,
	}, lines(done))
	requireLines(t, []string{
		`move.debited move from="ana" to="shut" amount=5`,
		`move.returned relay from="ana" to="shut" amount=5`,
	}, lines(returned))

	// The repository's operations reach the same Observer: the debits.
	guarded := 0
	for _, e := range rec.all() {
		if e.Kind == observe.OpEnd && e.Op == "guarded" && e.Collection == "accounts" && e.Outcome == observe.OK {
			guarded++
		}
	}
	require.GreaterOrEqual(t, guarded, 2, "the two debits at least")

	c := counters.Counts()
	require.Equal(t, [3]int64{2, 1, 1}, [3]int64{c.MovesDebited, c.MovesDone, c.MovesReturned})
	require.Contains(t, c.String(), "moves debited 2, done 1, returned 1")
	// The slog Observer, joined after the counters, may still be writing
	// the last line: stop the relay before the log is read.
	stop()
	wg.Wait()
	log := logged.String()
	require.Contains(t, log, `msg="mongocas move.returned"`)
	require.Contains(t, log, `from="\"ana\"" to="\"shut\"" amount=5 age=`)
	require.NotContains(t, log, "move.done", "a move done is normal work: Debug")
}

// TestMoveAllEvents: MoveAll's debits, and the returns it makes itself
// after a step fails, report op "all"; a step's return is reported once,
// by MoveAll, though the relay runs the step's job after it.
func TestMoveAllEvents(t *testing.T) {
	db := mongotest.New(t)
	ctx := t.Context()
	rec := &recorder{}
	q, m := accountsMover(t, db, rec)
	runCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = q.Run(runCtx) })
	defer func() { stop(); wg.Wait() }()

	saga, err := m.MoveAll(ctx, []move.Step{{From: "ana", To: "ben", Amount: 2}, {From: "ana", To: "shut", Amount: 1}})
	require.ErrorIs(t, err, move.ErrAborted)
	waitFor(t, func() bool {
		counts, err := q.Counts(ctx)
		require.NoError(t, err)
		return counts[deferred.StateCompleted] == 2
	})
	var got []string
	for _, e := range rec.all() {
		if strings.HasPrefix(e.Kind.String(), "move.") {
			id, ok := e.ID.(bson.ObjectID)
			require.True(t, ok, "a move's event names its id: %v", e.ID)
			step := slices.Index(saga.Moves, id)
			got = append(got, fmt.Sprintf("%d %s %s to=%s amount=%d", step, e.Kind, e.Op, e.To, e.Amount))
		}
	}
	requireLines(t, []string{
		`0 move.debited all to="ben" amount=2`,
		`1 move.debited all to="shut" amount=1`,
		`0 move.returned all to="ben" amount=2`,
		`1 move.returned all to="shut" amount=1`,
	}, got)
}

// accountsMover inserts ana (100), ben (0) and shut (0, closed: it refuses
// credits) in accounts, and returns a queue (not running) and a Mover of
// their balances that reports to obs.
func accountsMover(t *testing.T, db *mongotest.DB, obs observe.Observer) (*deferred.Queue, *move.Mover) {
	t.Helper()
	ctx := t.Context()
	accounts := db.Collection("accounts")
	_, err := accounts.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: "ana"}, {Key: "balance", Value: int64(100)}, {Key: "version", Value: int64(1)}},
		bson.D{{Key: "_id", Value: "ben"}, {Key: "balance", Value: int64(0)}, {Key: "version", Value: int64(1)}},
		bson.D{{Key: "_id", Value: "shut"}, {Key: "balance", Value: int64(0)}, {Key: "closed", Value: true}, {Key: "version", Value: int64(1)}},
	})
	require.NoError(t, err)
	q, err := deferred.New(db.Collection("jobs"), &deferred.Options{PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	m, err := move.New(ctx, q, accounts, &move.Options{
		Field:    "balance",
		Accept:   bson.D{{Key: "closed", Value: bson.D{{Key: "$ne", Value: true}}}},
		Observer: obs,
	})
	require.NoError(t, err)
	return q, m
}

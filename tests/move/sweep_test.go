package move_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/move"
)

// TestSweepReturnsTheDebitedAmountAfterTheRelayDiedRefused: a relay job
// that left its refusal marker on the target and died before it returned
// the value (its attempts used up) leaves a move that Sweep must finish.
// Sweep rebuilds one job for the move, from the first trace of it that it
// reads: here the target's marker. Whatever job runs, the value the debit
// took comes back in full, exactly once: the amount is the one the debit
// recorded, not the one a rebuilt job carries.
func TestSweepReturnsTheDebitedAmountAfterTheRelayDiedRefused(t *testing.T) {
	b := setup(t)
	f := b.db.Faulty(t, nil)
	// The target first, so that whichever order Sweep reads the documents
	// in (natural or by the count of entries), its marker comes first.
	require.NoError(t, b.accounts.Insert(b.ctx, &account{ID: "shut", Closed: true}))
	b.insert(t, "ana", 100)
	b.insert(t, "ben", 0)
	opts := &move.Options{Field: "balance", Grace: time.Nanosecond,
		Outcomes: b.db.Collection("accounts_moves"),
		Accept:   bson.D{{Key: "closed", Value: bson.D{{Key: "$ne", Value: true}}}}}

	// A move to ben whose queue (jobs of its own) never runs: ana holds
	// two pending entries.
	idleJobs, err := deferred.New(b.db.Collection("idle_jobs"), nil)
	require.NoError(t, err)
	idle := b.mover(t, idleJobs, nil, opts)
	other, err := idle.Move(b.ctx, "ana", "ben", 10, nil)
	require.NoError(t, err)

	// The move to shut, on a queue that gives a job one attempt; its
	// return on ana (F) fails once.
	once := b.queueOnce(t)
	m := b.mover(t, once, f.Database, opts)
	id, err := m.Move(b.ctx, "ana", "shut", 30, nil)
	require.NoError(t, err)
	failed := failWrite(f, "finish", id)
	stop := run(t, once)
	select {
	case <-failed.Fired():
	case <-time.After(time.Minute):
		t.Fatal("the return on ana was never sent")
	}
	requireDeadJob(t, b, once)
	stop()
	require.Equal(t, move.Pending, mustStatus(t, b, id), "refused on shut, not yet returned")
	require.Equal(t, int64(60), b.balance(t, "ana"))

	n, err := m.Sweep(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n, "one job for each move: the one to shut (its job is dead), the one to ben (queued on another queue)")
	relay := b.queue(t, nil) // the same jobs, with attempts to spare
	b.mover(t, relay, nil, opts)
	run(t, relay)
	require.Equal(t, move.Returned, waitStatus(t, b.observer(t), id))
	require.Equal(t, move.Done, waitStatus(t, b.observer(t), other))
	b.requireNoMoveState(t)
	b.requireBalances(t, map[string]int64{"ana": 90, "ben": 10, "shut": 0})
	var rec struct {
		Outcome string `bson:"outcome"`
		V       int64  `bson:"v"`
	}
	require.NoError(t, b.db.Collection("accounts_moves").FindOne(b.ctx, bson.D{{Key: "_id", Value: id}}).Decode(&rec))
	require.Equal(t, "returned", rec.Outcome)
	require.Equal(t, int64(30), rec.V, "the outcome records the amount moved")
	total, err := b.observer(t).Sum(b.ctx, "ana", "ben", "shut")
	require.NoError(t, err)
	require.Equal(t, int64(100), total.Sum)
}

func mustStatus(t *testing.T, b *bundle, id bson.ObjectID) move.Status {
	t.Helper()
	st, err := b.observer(t).Status(b.ctx, "ana", id)
	require.NoError(t, err)
	return st
}

// requireDeadJob waits until q counts a dead job.
func requireDeadJob(t *testing.T, b *bundle, q *deferred.Queue) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		counts, err := q.Counts(b.ctx)
		require.NoError(t, err)
		if counts[deferred.StateDead] > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dead job after a minute: %v", counts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSweepEnqueuesOneJobPerMoveThatHasNoUnfinishedOne: a relay that is
// behind is not handed the same moves again on every Sweep. Moves whose
// jobs are queued get none; once those jobs are cancelled, each move gets
// one (not one per record), and the next Sweep none. The relay then
// settles them.
func TestSweepEnqueuesOneJobPerMoveThatHasNoUnfinishedOne(t *testing.T) {
	b := setup(t)
	q := b.queue(t, nil)
	m := b.mover(t, q, nil, nil)
	ids := b.threeMovesToBen(t, m)
	n, err := m.Sweep(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "each move's own job is queued")

	cur, err := q.Jobs().Find(b.ctx, bson.D{})
	require.NoError(t, err)
	var jobs []deferred.Job
	require.NoError(t, cur.All(b.ctx, &jobs))
	require.Len(t, jobs, 3)
	for _, j := range jobs {
		require.NoError(t, q.Cancel(b.ctx, j.ID))
	}
	n, err = m.Sweep(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n, "a job for each move whose job was cancelled")
	n, err = m.Sweep(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the jobs the last Sweep enqueued are queued")

	run(t, q)
	for _, id := range ids {
		require.Equal(t, move.Done, waitStatus(t, m, id))
	}
	b.requireNoMoveState(t)
	b.requireBalances(t, map[string]int64{"ana": 70, "ben": 30})
}

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
// Sweep rebuilds a job from each trace of the move: the source's pending
// entry, and the target's marker, which the job built from it may run
// first. Whatever job runs first, the value the debit took comes back in
// full, exactly once: the amount is the one the debit recorded, not the
// one a rebuilt job carries.
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
	require.GreaterOrEqual(t, n, 3, "a job from shut's marker and one from each of ana's entries")
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

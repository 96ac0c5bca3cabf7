package move_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/move"
)

// TestUnsettledListsEveryRecordOfAMoveUntilTheRelayCleansIt: the records a
// move leaves in documents, made by real moves whose relays die at chosen
// writes (one attempt each), are listed oldest first with their stage,
// ends, amount and outcome: a pending entry whose relay never ran; a
// pending entry and the target's credit marker, the relay dead before the
// source's finish; an outcome and a marker, the relay dead before the
// outcome left the source. Once Sweep and a relay run, nothing is listed.
func TestUnsettledListsEveryRecordOfAMoveUntilTheRelayCleansIt(t *testing.T) {
	b := setup(t)
	f := b.db.Faulty(t, nil)
	b.insert(t, "ana", 100)
	b.insert(t, "ben", 0)
	b.insert(t, "cy", 0)
	coll := b.db.Collection("accounts")
	none, err := move.Unsettled(b.ctx, coll, "", 0)
	require.NoError(t, err)
	require.Empty(t, none)

	// A move whose queue never runs: a pending entry on ana.
	idleJobs, err := deferred.New(b.db.Collection("idle_jobs"), nil)
	require.NoError(t, err)
	idle := b.mover(t, idleJobs, nil, nil)
	toCy, err := idle.Move(b.ctx, "ana", "cy", 5, nil)
	require.NoError(t, err)

	// Two moves on a queue that gives a job one attempt: the first relay
	// dies before the finish on ana, the second before the outcome leaves
	// ana.
	once := b.queueOnce(t)
	m := b.mover(t, once, f.Database, nil)
	toBen, err := m.Move(b.ctx, "ana", "ben", 30, nil)
	require.NoError(t, err)
	toCy2, err := m.Move(b.ctx, "ana", "cy", 7, nil)
	require.NoError(t, err)
	finish, record := failWrite(f, "finish", toBen), failWrite(f, "record", toCy2)
	stop := run(t, once)
	for _, fault := range []*mongotest.Fault{finish, record} {
		select {
		case <-fault.Fired():
		case <-time.After(time.Minute):
			t.Fatal("a relay never reached the write it was to die at")
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		counts, err := once.Counts(b.ctx)
		require.NoError(t, err)
		if counts[deferred.StateDead] == 2 {
			break
		}
		require.True(t, time.Now().Before(deadline), "two dead jobs: %v", counts)
		time.Sleep(20 * time.Millisecond)
	}
	stop()

	got, err := move.Unsettled(b.ctx, coll, "", 0)
	require.NoError(t, err)
	type row struct {
		move     bson.ObjectID
		doc      string
		stage    move.Stage
		from, to string
		amount   int64
		outcome  move.Status
	}
	want := map[row]bool{
		{toCy, "ana", move.StagePending, "ana", "cy", 5, ""}:          true,
		{toBen, "ana", move.StagePending, "ana", "ben", 30, ""}:       true,
		{toBen, "ben", move.StageMarker, "ana", "ben", 30, move.Done}: true,
		{toCy2, "ana", move.StageOutcome, "ana", "cy", 7, move.Done}:  true,
		{toCy2, "cy", move.StageMarker, "ana", "cy", 7, move.Done}:    true,
	}
	seen := map[row]bool{}
	for i, e := range got {
		if i > 0 {
			require.False(t, e.At.Before(got[i-1].At), "oldest first")
		}
		require.WithinDuration(t, time.Now(), e.At, time.Minute)
		seen[row{e.Move, e.Doc.StringValue(), e.Stage, e.From.StringValue(), e.To.StringValue(), e.Amount, e.Outcome}] = true
	}
	require.Equal(t, want, seen)
	require.Len(t, got, len(want))

	two, err := move.Unsettled(b.ctx, coll, "", 2)
	require.NoError(t, err)
	require.Equal(t, got[:2], two, "the limit keeps the oldest")

	// Bad input: nothing is read.
	for _, c := range []struct {
		state string
		limit int
	}{{"$where", 0}, {"_mv.o", 0}, {"", -1}} {
		_, err := move.Unsettled(b.ctx, coll, c.state, c.limit)
		require.ErrorIs(t, err, move.ErrInvalid, "%+v", c)
	}
	_, err = move.Unsettled(b.ctx, nil, "", 0)
	require.ErrorIs(t, err, move.ErrInvalid)

	// Sweep and a relay with attempts to spare settle and clean it all.
	n, err := m.Sweep(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n, "a job for each move, none of which has an unfinished job on this queue")
	relay := b.queue(t, nil)
	b.mover(t, relay, nil, nil)
	run(t, relay)
	for _, id := range []bson.ObjectID{toCy, toBen, toCy2} {
		require.Equal(t, move.Done, waitStatus(t, b.observer(t), id))
	}
	b.requireNoMoveState(t)
	none, err = move.Unsettled(b.ctx, coll, "", 0)
	require.NoError(t, err)
	require.Empty(t, none)
	b.requireBalances(t, map[string]int64{"ana": 58, "ben": 30, "cy": 12})
}

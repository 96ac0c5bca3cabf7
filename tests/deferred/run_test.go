package deferred_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
)

// inOrder is a change that refuses to overdraw (permanently) and records
// the index of the last change applied, failing on one that comes out of
// order.
func inOrder(calls *atomic.Int64) func(a *account, c credit) error {
	return func(a *account, c credit) error {
		calls.Add(1)
		switch {
		case c.Index <= a.Last:
			return retry.Permanent(errors.New("out of order"))
		case a.Balance+c.Amount < 0:
			return retry.Permanent(errInsufficient)
		}
		a.Balance += c.Amount
		a.Applied++
		a.Last = c.Index
		return nil
	}
}

// queuedInOrder queues changes of amounts (indexes 1, 2, ...) on the
// account "ana" through an inOrder change, and runs none of them.
func queuedInOrder(t *testing.T, amounts ...int64) (*bundle, *deferred.Queue, []bson.ObjectID, *atomic.Int64) {
	t.Helper()
	b := setup(t)
	q := b.queue(t, nil, nil)
	calls := new(atomic.Int64)
	change, err := deferred.NewChange(q, "add", b.accounts, inOrder(calls))
	require.NoError(t, err)
	b.insert(t, "ana")
	ids := make([]bson.ObjectID, 0, len(amounts))
	for i, amount := range amounts {
		ids = append(ids, enqueue(t, b.ctx, change, "ana", credit{Amount: amount, Index: int64(i + 1)}))
	}
	return b, q, ids, calls
}

// TestChangeRunStopsAtAFailingChange: four changes of one document queued
// before Run are one run; the third overdraws. The two before it land in
// one write, the third is dead at once, the fourth lands after it: in
// order, each once, in two writes to the document.
func TestChangeRunStopsAtAFailingChange(t *testing.T) {
	t.Parallel()
	b, q, ids, _ := queuedInOrder(t, 10, 20, -100, 5)
	v0 := b.get(t, "ana").Version
	run(t, q)
	for i, id := range ids {
		job := wait(t, q, id)
		want := deferred.StateCompleted
		if i == 2 {
			want = deferred.StateDead
			require.ErrorContains(t, errors.New(job.Errors[0].Error), errInsufficient.Error())
		}
		require.Equal(t, want, job.State, "job %d", i+1)
		require.Equal(t, 1, job.Attempt, "job %d", i+1)
	}
	a := b.get(t, "ana")
	require.Equal(t, int64(35), a.Balance)
	require.Equal(t, int64(3), a.Applied)
	require.Equal(t, int64(4), a.Last)
	require.Equal(t, v0+2, a.Version, "the first two in one write, the fourth in another")
}

// TestChangeRunAfterAPartlyAppliedRun: the document carries the stamp of
// the second of three queued changes (an earlier run wrote them and its
// worker died before recording them). The run's fence fails; the jobs are
// taken one at a time, the first two complete without applying again, and
// the third applies once.
func TestChangeRunAfterAPartlyAppliedRun(t *testing.T) {
	t.Parallel()
	b, q, ids, calls := queuedInOrder(t, 10, 10, 10)
	second, err := q.Job(b.ctx, ids[1])
	require.NoError(t, err)
	_, err = b.accounts.Collection().UpdateOne(b.ctx, bson.D{{Key: "_id", Value: "ana"}}, bson.D{
		{Key: "$set", Value: bson.D{{Key: second.FenceField(), Value: second.Seq}, {Key: "balance", Value: 20}, {Key: "applied", Value: 2}, {Key: "last", Value: 2}}},
		{Key: "$inc", Value: bson.D{{Key: "version", Value: 1}}},
	})
	require.NoError(t, err)
	run(t, q)
	for _, id := range ids {
		require.Equal(t, deferred.StateCompleted, wait(t, q, id).State)
	}
	b.requireAccount(t, "ana", 30, 3)
	require.Equal(t, int64(1), calls.Load(), "only the third change ran")
}

// TestRunWritesSettleLostReplies: five jobs of one key queued before Run
// are one run; the replies of its claim and of its record are lost. Both
// are settled by re-reading the jobs: each job applies once and completes
// at its first attempt.
func TestRunWritesSettleLostReplies(t *testing.T) {
	t.Parallel()
	b, k, calls := setupCredit(t)
	ids := make([]bson.ObjectID, 0, 5)
	for i := range 5 {
		ids = append(ids, enqueue(t, b.ctx, k, "ana", credit{Amount: 1, Index: int64(i + 1)}))
	}
	updates := mongotest.Commands([]string{"update"}, b.jobs.Name())
	claim := b.f.DropNextReply(updates)
	record := b.f.DropNextReply(updates)
	run(t, b.fqueue)
	for _, id := range ids {
		job := wait(t, b.obs, id)
		require.Equal(t, deferred.StateCompleted, job.State)
		require.Equal(t, 1, job.Attempt)
	}
	require.True(t, claim.HasFired())
	require.True(t, record.HasFired())
	b.requireAccount(t, "ana", 5, 5)
	require.Equal(t, int64(5), calls.Load())
}

// TestRunRecordsEachJobBeforeTheNext: five jobs of one key queued before
// Run are one run; each handler finds the job before it recorded as
// completed, so no job of the key starts before the one ahead of it is
// finished, even within a run (a worker that died would deliver again only
// the job it was running).
func TestRunRecordsEachJobBeforeTheNext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	ids := make([]bson.ObjectID, 0, 5)
	var early atomic.Int64
	k, err := deferred.Register(q, "check", func(ctx context.Context, job *deferred.Job, c credit) error {
		if c.Index > 1 {
			prev, err := q.Job(ctx, ids[c.Index-2])
			if err != nil {
				return err
			}
			if prev.State != deferred.StateCompleted {
				early.Add(1)
			}
		}
		return nil
	})
	require.NoError(t, err)
	for i := range 5 {
		ids = append(ids, enqueue(t, b.ctx, k, "x", credit{Index: int64(i + 1)}))
	}
	run(t, q)
	for _, id := range ids {
		job := wait(t, q, id)
		require.Equal(t, deferred.StateCompleted, job.State)
		require.Equal(t, 1, job.Attempt)
	}
	require.Zero(t, early.Load(), "a job started before the one ahead of it was recorded")
}

package deferred_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
)

// TestRunFunctionTakesARunWholeAndLeavesTheRestOneByOne registers a handler
// with a run function that takes, in one GuardedRun, the head of a run whose
// amounts are below 100, and leaves the rest to the handler. Six jobs of one
// key, due together: the first three go in one write, the fourth alone, the
// last two in one write; each applies once, in order.
func TestRunFunctionTakesARunWholeAndLeavesTheRestOneByOne(t *testing.T) {
	b := setup(t)
	b.insert(t, "ana")
	q := b.queue(t, nil, nil)
	var (
		mu         sync.Mutex
		alone      []int64   // the indexes the handler ran
		runs       [][]int64 // the indexes each run write applied
		badInput   []error   // GuardedRun's answers to jobs out of order, and to none
		firstCalls int
	)
	credits, err := deferred.RegisterRun(q, "credit-run", func(ctx context.Context, job *deferred.Job, c credit) error {
		mu.Lock()
		alone = append(alone, c.Index)
		mu.Unlock()
		_, err := deferred.Guarded(ctx, job, b.accounts, "ana", nil, bson.D{
			{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}},
			{Key: "$set", Value: bson.D{{Key: "last", Value: c.Index}}},
		})
		return err
	}, func(ctx context.Context, jobs []*deferred.Job) (int, error) {
		var sum int64
		var took []int64
		for _, job := range jobs {
			var c credit
			if err := job.Args.Unmarshal(&c); err != nil || c.Amount >= 100 {
				break
			}
			sum += c.Amount
			took = append(took, c.Index)
		}
		mu.Lock()
		if firstCalls++; firstCalls == 1 {
			reversed := slices.Clone(jobs)
			slices.Reverse(reversed)
			_, e1 := deferred.GuardedRun(ctx, reversed, b.accounts, "ana", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1000}}}})
			_, e2 := deferred.GuardedRun(ctx, nil, b.accounts, "ana", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1000}}}})
			badInput = append(badInput, e1, e2)
		}
		mu.Unlock()
		if len(took) < 2 {
			return 0, deferred.ErrOneByOne
		}
		n := len(took)
		_, err := deferred.GuardedRun(ctx, jobs[:n], b.accounts, "ana", nil, bson.D{
			{Key: "$inc", Value: bson.D{{Key: "balance", Value: sum}, {Key: "applied", Value: int64(n)}}},
			{Key: "$set", Value: bson.D{{Key: "last", Value: took[n-1]}}},
		})
		if err != nil {
			return 0, err
		}
		mu.Lock()
		runs = append(runs, took)
		mu.Unlock()
		if n < len(jobs) {
			return n, deferred.ErrOneByOne
		}
		return n, nil
	})
	require.NoError(t, err)

	amounts := []int64{1, 2, 3, 100, 4, 5}
	ids := make([]bson.ObjectID, 0, len(amounts))
	for i, amount := range amounts {
		ids = append(ids, enqueue(t, b.ctx, credits, "ana", credit{Amount: amount, Index: int64(i + 1)}))
	}
	run(t, q)
	for _, id := range ids {
		job := wait(t, q, id)
		require.Equal(t, deferred.StateCompleted, job.State, "%+v", job.Errors)
	}

	b.requireAccount(t, "ana", 115, 6)
	require.Equal(t, int64(6), b.get(t, "ana").Last)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, [][]int64{{1, 2, 3}, {5, 6}}, runs)
	require.Equal(t, []int64{4}, alone)
	require.Len(t, badInput, 2)
	for _, err := range badInput {
		var invalid *deferred.InvalidError
		require.ErrorAs(t, err, &invalid, "GuardedRun took bad input")
		require.ErrorIs(t, err, deferred.ErrInvalid)
	}
}

func TestRegisterRunRefusesANilRunFunction(t *testing.T) {
	b := setup(t)
	q := b.queue(t, nil, nil)
	_, err := deferred.RegisterRun(q, "credit-run", func(context.Context, *deferred.Job, credit) error { return nil }, nil)
	require.ErrorIs(t, err, deferred.ErrInvalid)
}

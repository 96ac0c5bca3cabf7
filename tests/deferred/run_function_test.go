package deferred_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// TestHandlerErrorMatchingErrOneByOneFailsTheAttempt: ErrOneByOne means
// "the rest one at a time" only from a run function. From a handler (a
// GuardedRun of its own job finding its stamp, passed up) it fails the
// attempt like any error, and the job dies at MaxAttempts instead of being
// run again for ever without an attempt counted.
func TestHandlerErrorMatchingErrOneByOneFailsTheAttempt(t *testing.T) {
	b := setup(t)
	q := b.queue(t, nil, &deferred.Options{MaxAttempts: 3})
	var calls atomic.Int64
	k, err := deferred.Register(q, "one-by-one", func(context.Context, *deferred.Job, credit) error {
		calls.Add(1)
		return fmt.Errorf("a write: %w", deferred.ErrOneByOne)
	})
	require.NoError(t, err)
	id := enqueue(t, b.ctx, k, "ana", credit{Amount: 1})
	run(t, q)
	job := wait(t, q, id)
	require.Equal(t, deferred.StateDead, job.State)
	require.Equal(t, 3, job.Attempt)
	require.EqualValues(t, 3, calls.Load())
}

// TestRunFunctionCountingPastItsRunKillsTheFirstJob: a run function that
// says it completed more jobs than it was handed (or fewer than none) is a
// bug in it: the run's first job dies with an *InvalidError (the run of the
// two left too), and the worker goes on: the last job, alone, runs.
func TestRunFunctionCountingPastItsRunKillsTheFirstJob(t *testing.T) {
	b := setup(t)
	b.insert(t, "ana")
	q := b.queue(t, nil, nil)
	k, err := deferred.RegisterRun(q, "miscount", func(ctx context.Context, job *deferred.Job, c credit) error {
		_, err := deferred.Guarded(ctx, job, b.accounts, "ana", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}}}})
		return err
	}, func(_ context.Context, jobs []*deferred.Job) (int, error) { return len(jobs) + 1, nil })
	require.NoError(t, err)
	ids := enqueueThree(t, b, k)
	run(t, q)
	first := wait(t, q, ids[0])
	require.Equal(t, deferred.StateDead, first.State)
	require.NotEmpty(t, first.Errors)
	require.Contains(t, first.Errors[len(first.Errors)-1].Error, "returned 4 for a run of 3 jobs")
	second := wait(t, q, ids[1])
	require.Equal(t, deferred.StateDead, second.State, "the run of the two left is miscounted too")
	require.Equal(t, deferred.StateCompleted, wait(t, q, ids[2]).State, "the last job, alone, goes to its handler")
	require.Equal(t, int64(1), b.get(t, "ana").Balance)
}

// TestGuardedRunRefusesJobsNotHandedToTheRun: a job read with Queue.Job (a
// later job of the key, not claimed) would lend its stamp to the jobs
// between, which would then find it and apply nothing.
func TestGuardedRunRefusesJobsNotHandedToTheRun(t *testing.T) {
	b := setup(t)
	b.insert(t, "ana")
	q := b.queue(t, nil, nil)
	var (
		third atomic.Value
		mu    sync.Mutex
		lent  error
	)
	k, err := deferred.Register(q, "lend", func(ctx context.Context, job *deferred.Job, c credit) error {
		inc := bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}}}}
		if c.Index == 1 {
			id, _ := third.Load().(bson.ObjectID)
			later, err := q.Job(ctx, id)
			if err != nil {
				return err
			}
			_, err = deferred.GuardedRun(ctx, []*deferred.Job{job, later}, b.accounts, "ana", nil, inc)
			mu.Lock()
			lent = err
			mu.Unlock()
		}
		_, err := deferred.Guarded(ctx, job, b.accounts, "ana", nil, inc)
		return err
	})
	require.NoError(t, err)
	ids := enqueueThree(t, b, k)
	third.Store(ids[2]) // before the queue runs: job 1 reads it
	run(t, q)
	for _, id := range ids {
		require.Equal(t, deferred.StateCompleted, wait(t, q, id).State)
	}
	mu.Lock()
	defer mu.Unlock()
	require.ErrorIs(t, lent, deferred.ErrInvalid)
	require.Equal(t, int64(3), b.get(t, "ana").Balance, "each job applied once")
}

// TestRunFunctionReturningFewerWithNoErrorGivesTheRestBack: (0, nil) is
// taken as ErrOneByOne, so the jobs go to the handler one at a time rather
// than back to the run function for ever.
func TestRunFunctionReturningFewerWithNoErrorGivesTheRestBack(t *testing.T) {
	b := setup(t)
	b.insert(t, "ana")
	q := b.queue(t, nil, &deferred.Options{MaxAttempts: 3})
	var fnCalls atomic.Int64
	k, err := deferred.RegisterRun(q, "fewer", func(ctx context.Context, job *deferred.Job, c credit) error {
		fnCalls.Add(1)
		_, err := deferred.Guarded(ctx, job, b.accounts, "ana", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}}})
		return err
	}, func(context.Context, []*deferred.Job) (int, error) { return 0, nil })
	require.NoError(t, err)
	ids := enqueueThree(t, b, k)
	run(t, q)
	for _, id := range ids {
		job := wait(t, q, id)
		require.Equal(t, deferred.StateCompleted, job.State)
		require.Equal(t, 1, job.Attempt)
	}
	b.requireAccount(t, "ana", 3, 3)
	require.EqualValues(t, 3, fnCalls.Load())
}

// TestRunWhoseWorkerLosesTheKeyIsRecordedAsItWent: another holder takes the
// key while a run function runs (its lease is written as a takeover writes
// it). What the run function completed is recorded completed, and what it
// gave back goes back unattempted, as for a handler: with MaxAttempts 1, no
// job dies for an attempt that did not run or that applied.
func TestRunWhoseWorkerLosesTheKeyIsRecordedAsItWent(t *testing.T) {
	for _, tc := range []struct {
		name string
		// applies says whether the run function's first call applies the
		// run before it returns (len, nil), or gives it back (0, ErrOneByOne).
		applies bool
	}{{"completed", true}, {"given back", false}} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t)
			b.insert(t, "ana")
			q := b.queue(t, nil, &deferred.Options{MaxAttempts: 1, VisibilityTimeout: 2 * time.Second})
			keys := b.db.Collection(b.jobs.Name() + "_keys")
			steal := func() {
				var kd bson.Raw
				require.NoError(t, keys.FindOne(context.Background(), bson.D{{Key: "_id", Value: "ana"}}).Decode(&kd))
				epoch, _ := kd.Lookup("_lease", "epoch").AsInt64OK()
				_, err := keys.UpdateOne(context.Background(), bson.D{{Key: "_id", Value: "ana"}}, bson.D{{Key: "$set", Value: bson.D{
					{Key: "_lease.owner", Value: "another"}, {Key: "_lease.epoch", Value: epoch + 1},
					{Key: "_lease.expiresAt", Value: time.Now().Add(3 * time.Second)},
				}}})
				require.NoError(t, err)
			}
			inc := func(n int) bson.D {
				return bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: int64(n)}, {Key: "applied", Value: int64(n)}}}}
			}
			var calls atomic.Int64
			k, err := deferred.RegisterRun(q, "lost", func(ctx context.Context, job *deferred.Job, _ credit) error {
				_, err := deferred.Guarded(ctx, job, b.accounts, "ana", nil, inc(1))
				return err
			}, func(ctx context.Context, jobs []*deferred.Job) (int, error) {
				first := calls.Add(1) == 1
				if first && !tc.applies {
					steal()
					<-ctx.Done()
					return 0, deferred.ErrOneByOne
				}
				if _, err := deferred.GuardedRun(ctx, jobs, b.accounts, "ana", nil, inc(len(jobs))); err != nil {
					return 0, err
				}
				if first {
					steal()
					<-ctx.Done()
				}
				return len(jobs), nil
			})
			require.NoError(t, err)
			ids := enqueueThree(t, b, k)
			run(t, q)
			for _, id := range ids {
				job := wait(t, q, id)
				require.Equal(t, deferred.StateCompleted, job.State, "%+v", job.Errors)
			}
			b.requireAccount(t, "ana", 3, 3)
		})
	}
}

// enqueueThree enqueues three credits of 1 on the key "ana" through k,
// indexed from 1, and returns their ids.
func enqueueThree(t *testing.T, b *bundle, k *deferred.Kind[credit]) []bson.ObjectID {
	t.Helper()
	ids := make([]bson.ObjectID, 0, 3)
	for i := range 3 {
		ids = append(ids, enqueue(t, b.ctx, k, "ana", credit{Amount: 1, Index: int64(i + 1)}))
	}
	return ids
}

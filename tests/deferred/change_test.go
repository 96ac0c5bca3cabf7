package deferred_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

var errInsufficient = errors.New("insufficient funds")

// spend is the change of the ModifyOrEnqueue tests: add Amount (negative:
// a debit, refused below zero).
func spend(a *account, c credit) error {
	if a.Balance+c.Amount < 0 {
		return retry.Permanent(errInsufficient)
	}
	a.Balance += c.Amount
	a.Applied++
	return nil
}

// TestModifyOrEnqueueUnderAConflictStorm: 16 goroutines in 4 processes
// (4 clients: versioned lines up the calls of one process, so conflicts
// come from the others) change one account at once through repositories
// that give up after 2 attempts. Calls whose retries run out are queued and
// applied later, exactly once; the final balance is the sum of every
// accepted change.
func TestModifyOrEnqueueUnderAConflictStorm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const processes = 4
	changes := make([]*deferred.Change[account, credit], processes)
	var q *deferred.Queue
	for i := range changes {
		db := b.db.Database
		if i > 0 {
			db = b.db.Faulty(t, nil).Database
		}
		impatient, err := versioned.New[account](db.Collection("accounts"), &versioned.Options{
			Retry: retry.Policy{MaxAttempts: 2, InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond},
		})
		require.NoError(t, err)
		pq := b.queue(t, db, nil)
		changes[i], err = deferred.NewChange(pq, "spend", impatient, spend)
		require.NoError(t, err)
		if i == 0 {
			q = pq
			require.NoError(t, impatient.Insert(b.ctx, &account{ID: "ana", Balance: 1000}))
		}
	}

	const workers, each = 16, 10
	var now, queued, failed atomic.Int64
	var mu sync.Mutex
	var accepted int64
	var jobs []bson.ObjectID
	// Rounds of calls until one ran out of retries (at most 5): on a fast
	// server, 16 callers in 4 processes now and then never conflict twice
	// in a row, and the storm is what this test is about.
	for round := 0; round < 5 && queued.Load() == 0; round++ {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range each {
					amount := int64(10 + w + i)
					if i%3 == 0 {
						amount = -amount
					}
					res, err := changes[w%processes].ModifyOrEnqueue(b.ctx, "ana", credit{Amount: amount})
					switch {
					case errors.Is(err, errInsufficient):
						failed.Add(1)
						continue
					case err != nil:
						t.Errorf("modify or enqueue: %v", err)
						return
					case res.Queued:
						queued.Add(1)
						require.True(t, deferred.Exhausted(res.Cause), "%v", res.Cause)
						require.Nil(t, res.Doc)
						mu.Lock()
						jobs = append(jobs, res.JobID)
						mu.Unlock()
					default:
						now.Add(1)
						require.NotNil(t, res.Doc)
					}
					mu.Lock()
					accepted += amount
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	require.Positive(t, queued.Load(), "no call ran out of retries: no storm")
	run(t, q)
	declined := 0
	for _, id := range jobs {
		job := wait(t, q, id)
		switch job.State {
		case deferred.StateCompleted:
		case deferred.StateDead:
			// Refused when its turn came (the balance had moved): a failed
			// change, not an accepted one.
			require.Contains(t, job.Errors[0].Error, errInsufficient.Error())
			var c credit
			require.NoError(t, job.Args.Unmarshal(&c))
			accepted -= c.Amount
			declined++
		default:
			t.Fatalf("job %s: %s", id.Hex(), job.State)
		}
	}
	a := b.get(t, "ana")
	t.Logf("applied now %d, queued and applied later %d, failed %d (+%d declined later)", now.Load(), queued.Load()-int64(declined), failed.Load(), declined)
	require.Equal(t, 1000+accepted, a.Balance, "every accepted change, once")
	require.Equal(t, now.Load()+queued.Load()-int64(declined), a.Applied)
}

// setupSpend is a bundle with the change "spend" registered on a queue of
// its own (through its repository) and the account "ana".
func setupSpend(t testing.TB) (*bundle, *deferred.Queue, *deferred.Change[account, credit]) {
	t.Helper()
	b := setup(t)
	q := b.queue(t, nil, nil)
	change, err := deferred.NewChange(q, "spend", b.accounts, spend)
	require.NoError(t, err)
	b.insert(t, "ana")
	return b, q, change
}

// TestModifyOrEnqueueOtherErrors: fn's own error and a missing document are
// returned as they are; nothing is queued.
func TestModifyOrEnqueueOtherErrors(t *testing.T) {
	t.Parallel()
	b, _, change := setupSpend(t)
	_, err := change.ModifyOrEnqueue(b.ctx, "ana", credit{Amount: -5})
	require.ErrorIs(t, err, errInsufficient)
	_, err = change.ModifyOrEnqueue(b.ctx, "bob", credit{Amount: 5})
	require.ErrorIs(t, err, versioned.ErrNotFound)
	_, err = change.ModifyOrEnqueue(b.ctx, bson.D{{Key: "$ne", Value: ""}}, credit{Amount: 5})
	require.ErrorIs(t, err, deferred.ErrInvalid)
	res, err := change.ModifyOrEnqueue(b.ctx, "ana", credit{Amount: 5})
	require.NoError(t, err)
	require.False(t, res.Queued)
	require.Equal(t, int64(5), res.Doc.Balance)
	n, err := b.jobs.CountDocuments(b.ctx, bson.D{})
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestChangeAppliesOnceAcrossLostReplies: the queued change's write lands
// and its reply is lost, then lands and its acknowledgment is replaced by an
// error: it is applied once.
func TestChangeAppliesOnceAcrossLostReplies(t *testing.T) {
	t.Parallel()
	b := setupFaulty(t, nil)
	change, err := deferred.NewChange(b.fqueue, "spend", b.frepo, spend)
	require.NoError(t, err)
	b.insert(t, "ana")
	var calls atomic.Int64
	counted, err := deferred.NewChange(b.fqueue, "counted", b.frepo, func(a *account, c credit) error {
		calls.Add(1)
		return spend(a, c)
	})
	require.NoError(t, err)
	id1 := enqueue(t, b.ctx, change, "ana", credit{Amount: 7})
	id2 := enqueue(t, b.ctx, counted, "ana", credit{Amount: 100})
	// The first write to the accounts lands and its reply is lost
	// (versioned settles it by its write id); the second lands and its
	// reply says it failed (the attempt fails; the next finds the stamp and
	// does not call the function again).
	accounts := mongotest.Writes("accounts")
	drop := b.f.DropNextReply(accounts)
	lie := b.f.ErrorAfterApply(accounts, mongotest.ServerError{Code: 2, CodeName: "BadValue"})
	run(t, b.fqueue)
	require.Equal(t, deferred.StateCompleted, wait(t, b.obs, id1).State)
	job := wait(t, b.obs, id2)
	require.True(t, drop.HasFired())
	require.True(t, lie.HasFired())
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Equal(t, 2, job.Attempt)
	require.Equal(t, int64(1), calls.Load(), "the second attempt found the change applied")
	b.requireAccount(t, "ana", int64(107), int64(2))
}

// TestChangeSeesFreshState: a queued change's function runs on the state
// the document has when its turn comes, and a change it refuses then is
// dead at once (retry.Permanent), the key moving on.
func TestChangeSeesFreshState(t *testing.T) {
	t.Parallel()
	b, q, change := setupSpend(t)
	debit := enqueue(t, b.ctx, change, "ana", credit{Amount: -50})
	credit1 := enqueue(t, b.ctx, change, "ana", credit{Amount: 100})
	debit2 := enqueue(t, b.ctx, change, "ana", credit{Amount: -50})
	run(t, q)
	require.Equal(t, deferred.StateDead, wait(t, q, debit).State, "nothing to debit yet")
	require.Equal(t, deferred.StateCompleted, wait(t, q, credit1).State)
	require.Equal(t, deferred.StateCompleted, wait(t, q, debit2).State)
	require.Equal(t, int64(50), b.get(t, "ana").Balance)
}

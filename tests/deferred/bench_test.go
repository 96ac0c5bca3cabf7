package deferred_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/deferred"
)

// BenchmarkWorkerPool measures how fast one Run of 10 workers works through
// b.N jobs enqueued beforehand, on one key (one at a time, in order) and
// spread over 50 keys. Each job is a Guarded $inc of its key's account,
// exactly once. jobs/s is the throughput; x-raw is the time per job over
// the time of one plain updateOne by _id on the same server, measured in the
// same run: what the queue's bookkeeping costs, in round trips' worth.
//
//	go test -run '^$' -bench WorkerPool -benchtime 400x ./tests/deferred
func BenchmarkWorkerPool(b *testing.B) {
	for _, keys := range []int{1, 50} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) { benchmarkPool(b, keys, 0) })
	}
}

// BenchmarkFinishedJobs is BenchmarkWorkerPool over 50 keys with 100, then
// 10,000 completed jobs already in the collection: a worker that seeks what
// it needs works as fast with either (jobs/s within 20%).
//
//	go test -run '^$' -bench FinishedJobs -benchtime 400x -count 2 ./tests/deferred
func BenchmarkFinishedJobs(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("finished=%d", n), func(b *testing.B) { benchmarkPool(b, 50, n) })
	}
}

// BenchmarkDrainChanges measures how fast one Run of 10 workers drains b.N
// Changes queued beforehand on one document (the conflict storm's backlog)
// or spread over 50: jobs/s, and x-raw, a job's time over a plain
// updateOne's measured before and after in the same run.
//
//	go test -run '^$' -bench DrainChanges -benchtime 1000x ./tests/deferred
func BenchmarkDrainChanges(b *testing.B) {
	for _, keys := range []int{1, 50} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) { drainChanges(b, keys, 0, 0) })
	}
}

// BenchmarkWaitingJobs is BenchmarkDrainChanges over 50 keys in runs of
// up to 10 jobs (Options.Batch), with none, then 20,000 jobs of another
// program waiting in the collection: each claim and record of a run finds
// its jobs by _id, however many others wait in the same state (jobs/s
// within 20%; a claim that read every waiting job, as an updateMany by
// {_id: {$in: ids}} did on DocumentDB, made the second several times
// slower).
//
//	go test -run '^$' -bench WaitingJobs -benchtime 2000x ./tests/deferred
func BenchmarkWaitingJobs(b *testing.B) {
	for _, n := range []int{0, 20000} {
		b.Run(fmt.Sprintf("waiting=%d", n), func(b *testing.B) { drainChanges(b, 50, 10, n) })
	}
}

// drainChanges is BenchmarkDrainChanges over keys keys, with Options.Batch
// batch (0: the default) and waiting jobs of another program stored first.
//
//nolint:thelper // the body of a benchmark, run once per key count
func drainChanges(b *testing.B, keys, batch, waiting int) {
	bb := setup(b)
	q := bb.queue(b, nil, &deferred.Options{Workers: 10, Retention: time.Minute, Batch: batch})
	storedJobs(b, bb, q, waiting, deferred.StateAvailable)
	change, err := deferred.NewChange(q, "add", bb.accounts, func(a *account, c credit) error {
		a.Balance += c.Amount
		a.Applied++
		return nil
	})
	require.NoError(b, err)
	ids := accounts(b, bb, keys)
	for i := range b.N {
		enqueue(b, bb.ctx, change, ids[i%keys], credit{Amount: 1})
	}
	applied := func() (n int64) {
		for _, id := range ids {
			n += bb.get(b, id).Applied
		}
		return n
	}
	before := rawUpdate(b, bb)
	b.ResetTimer()
	start := time.Now()
	stop := run(b, q)
	for {
		n, err := bb.jobs.CountDocuments(bb.ctx, bson.D{{Key: "state", Value: deferred.StateCompleted}})
		require.NoError(b, err)
		if n == int64(b.N) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	stop()
	raw := (before + rawUpdate(b, bb)) / 2
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
	b.ReportMetric(float64(elapsed/time.Duration(b.N))/float64(raw), "x-raw")
	require.Equal(b, int64(b.N), applied(), "every change applied once")
}

// storedJobs stores n jobs in state on keys of their own, of a handler
// this program does not have: completed ones, as a queue that has run them
// keeps them until their retention ends; available ones, as another
// program's backlog (no key document names them: no worker here looks).
func storedJobs(b *testing.B, bb *bundle, q *deferred.Queue, n int, state deferred.State) {
	b.Helper()
	_, err := q.EnsureIndexes(bb.ctx)
	require.NoError(b, err)
	now := time.Now()
	for i := 0; i < n; i += 1000 {
		var docs []any
		for j := i; j < min(n, i+1000); j++ {
			docs = append(docs, bson.D{
				{Key: "_id", Value: bson.NewObjectID()}, {Key: "k", Value: fmt.Sprintf("old%d", j%500)}, {Key: "s", Value: int64(j)},
				{Key: "p", Value: fmt.Sprintf("old%d:%016x", j%500, j)}, // unique, as places are
				{Key: "name", Value: "inc"}, {Key: "args", Value: bson.D{{Key: "amount", Value: 1}}},
				{Key: "state", Value: state}, {Key: "attempt", Value: 1}, {Key: "max", Value: 10},
				{Key: "enqueued", Value: now}, {Key: "finished", Value: now}, {Key: "expireAt", Value: now.Add(time.Hour)},
			})
		}
		_, err := bb.jobs.InsertMany(bb.ctx, docs)
		require.NoError(b, err)
	}
}

//nolint:thelper // the body of a benchmark, run once per key count
func benchmarkPool(b *testing.B, keys, finished int) {
	bb := setup(b)
	raw := rawUpdate(b, bb)
	q := bb.queue(b, nil, &deferred.Options{Workers: 10, Retention: time.Minute})
	storedJobs(b, bb, q, finished, deferred.StateCompleted)
	var done atomic.Int64
	k, err := deferred.Register(q, "inc", func(ctx context.Context, job *deferred.Job, c credit) error {
		var id string
		if err := job.Key.Unmarshal(&id); err != nil {
			return err
		}
		_, err := deferred.Guarded(ctx, job, bb.accounts, id, nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}}}})
		if err == nil {
			done.Add(1)
		}
		return err
	})
	require.NoError(b, err)
	ids := accounts(b, bb, keys)
	for i := range b.N {
		_, err := k.Enqueue(bb.ctx, ids[i%keys], credit{Amount: 1})
		require.NoError(b, err)
	}
	b.ResetTimer()
	start := time.Now()
	stop := run(b, q)
	keysColl := bb.db.Collection("jobs_keys")
	for {
		if done.Load() >= int64(b.N) {
			n, err := keysColl.CountDocuments(bb.ctx, bson.D{{Key: "n", Value: bson.D{{Key: "$ne", Value: 0}}}})
			require.NoError(b, err)
			if n == 0 {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	stop()
	perJob := elapsed / time.Duration(b.N)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
	b.ReportMetric(float64(perJob)/float64(raw), "x-raw")
	var total int64
	for _, id := range ids {
		total += bb.get(b, id).Balance
	}
	require.Equal(b, int64(b.N), total, "every job applied once")
}

// accounts inserts n accounts, "k00", "k01", ..., and returns their ids.
func accounts(b *testing.B, bb *bundle, n int) []string {
	b.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("k%02d", i)
		bb.insert(b, ids[i])
	}
	return ids
}

// rawUpdate returns the mean time of a plain updateOne by _id ($inc) on
// the bundle's server.
func rawUpdate(b *testing.B, bb *bundle) time.Duration {
	b.Helper()
	coll := bb.db.Collection("raw")
	_, err := coll.UpdateOne(bb.ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 0}}}}, options.UpdateOne().SetUpsert(true))
	require.NoError(b, err)
	const n = 200
	start := time.Now()
	for range n {
		_, err := coll.UpdateOne(bb.ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}})
		require.NoError(b, err)
	}
	return time.Since(start) / n
}

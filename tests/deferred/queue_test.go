package deferred_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
)

// creditHandler registers "credit": add the amount to the account named by
// the job's key, once, and require that the job is the next one of its key.
func creditHandler(t testing.TB, b *bundle, q *deferred.Queue) *deferred.Kind[credit] {
	t.Helper()
	k, err := deferred.Register(q, "credit", func(ctx context.Context, job *deferred.Job, c credit) error {
		var id string
		if err := job.Key.Unmarshal(&id); err != nil {
			return err
		}
		_, err := deferred.Guarded(ctx, job, b.accounts, id,
			bson.D{{Key: "last", Value: c.Index - 1}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}},
				{Key: "$set", Value: bson.D{{Key: "last", Value: c.Index}}}})
		return err
	})
	require.NoError(t, err)
	return k
}

func TestEnqueueAndRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	credits := creditHandler(t, b, q)
	b.insert(t, "ana", "bob")
	ids := make([]bson.ObjectID, 0, 10)
	for i := range int64(5) {
		for _, who := range []string{"ana", "bob"} {
			id := enqueue(t, b.ctx, credits, who, credit{Amount: 10 * (i + 1), Index: i + 1})
			ids = append(ids, id)
		}
	}
	run(t, q)
	for _, id := range ids {
		job := wait(t, q, id)
		require.Equal(t, deferred.StateCompleted, job.State, "%+v", job.Errors)
		require.Equal(t, 1, job.Attempt)
	}
	for _, who := range []string{"ana", "bob"} {
		b.requireAccount(t, who, 150, 5)
		require.Equal(t, int64(5), b.get(t, who).Last)
	}
	counts, err := q.Counts(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(10), counts[deferred.StateCompleted])
}

// TestFirstEnqueuesOfAKeyRace: the first enqueues of fresh keys race from
// four clients at once (8 per key). Every job gets its own number among the
// key's reserved ones (off+1 .. off+tail), so all of them run. On FerretDB
// v2 + DocumentDB, whose concurrent upserts of one new _id can each answer
// with the document it would have made, numbering by upsert gave jobs
// numbers off another offset, which no worker ever reached.
func TestFirstEnqueuesOfAKeyRace(t *testing.T) {
	b := setup(t)
	const clients, keys, perKey = 4, 20, 8
	kinds := make([]*deferred.Kind[credit], clients)
	var q *deferred.Queue
	for i := range kinds {
		db := b.db.Database
		if i > 0 {
			db = b.db.Faulty(t, nil).Database
		}
		pq := b.queue(t, db, nil)
		var err error
		kinds[i], err = deferred.Register(pq, "credit", func(ctx context.Context, job *deferred.Job, c credit) error {
			var id string
			if err := job.Key.Unmarshal(&id); err != nil {
				return err
			}
			_, err := deferred.Guarded(ctx, job, b.accounts, id, bson.D{},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}, {Key: "applied", Value: int64(1)}}}})
			return err
		})
		require.NoError(t, err)
		if i == 0 {
			q = pq
		}
	}
	var ids []bson.ObjectID
	var mu sync.Mutex
	for k := range keys {
		id := fmt.Sprintf("fresh%02d", k)
		b.insert(t, id)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for j := range perKey {
			wg.Go(func() {
				<-start
				jid, err := kinds[j%clients].Enqueue(b.ctx, id, credit{Amount: int64(j + 1)})
				if err != nil {
					t.Errorf("enqueue on %s: %v", id, err)
					return
				}
				mu.Lock()
				ids = append(ids, jid)
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
	}
	require.Len(t, ids, keys*perKey)

	// Every key's jobs hold distinct numbers within the key's reserved ones.
	cur, err := q.Keys().Find(b.ctx, bson.D{})
	require.NoError(t, err)
	var kds []struct {
		ID   string `bson:"_id"`
		Off  int64  `bson:"off"`
		Tail int64  `bson:"tail"`
	}
	require.NoError(t, cur.All(b.ctx, &kds))
	require.Len(t, kds, keys)
	for _, kd := range kds {
		require.Equal(t, int64(perKey), kd.Tail, "%s: numbers reserved", kd.ID)
		cur, err := q.Jobs().Find(b.ctx, bson.D{{Key: "k", Value: kd.ID}})
		require.NoError(t, err)
		var jobs []struct {
			S int64 `bson:"s"`
		}
		require.NoError(t, cur.All(b.ctx, &jobs))
		seen := map[int64]bool{}
		for _, j := range jobs {
			require.True(t, j.S > kd.Off && j.S <= kd.Off+kd.Tail, "%s: job number %d outside %d+1..%d", kd.ID, j.S, kd.Off, kd.Tail)
			require.False(t, seen[j.S], "%s: number %d twice", kd.ID, j.S)
			seen[j.S] = true
		}
		require.Len(t, seen, perKey, "%s: jobs", kd.ID)
	}

	run(t, q)
	for _, id := range ids {
		require.Equal(t, deferred.StateCompleted, wait(t, q, id).State)
	}
	for k := range keys {
		b.requireAccount(t, fmt.Sprintf("fresh%02d", k), perKey*(perKey+1)/2, perKey)
	}
}

// TestNumericKeysOfEveryTypeAreOneKey: 7 as an int32, an int64 and a
// double is one key to the server, so one queue: jobs enqueued on it in
// each of the three types all run, once each and in the order of their
// enqueues (a job's place is made from the key as its document stores
// it), and each job keeps its key as it was enqueued.
func TestNumericKeysOfEveryTypeAreOneKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t, nil, nil)
	var mu sync.Mutex
	var order []int64
	k, err := deferred.Register(q, "note", func(_ context.Context, _ *deferred.Job, c credit) error {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, c.Index)
		return nil
	})
	require.NoError(t, err)
	keys := []any{int32(7), int64(7), float64(7)}
	ids := make([]bson.ObjectID, 0, 9)
	for i := range int64(9) {
		ids = append(ids, enqueue(t, b.ctx, k, keys[i%3], credit{Index: i}))
	}
	run(t, q)
	for i, id := range ids {
		job := wait(t, q, id)
		require.Equal(t, deferred.StateCompleted, job.State)
		require.Equal(t, []bson.Type{bson.TypeInt32, bson.TypeInt64, bson.TypeDouble}[i%3], job.Key.Type, "the key as it was enqueued")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8}, order)
	n, err := q.Keys().CountDocuments(b.ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "one key document")
}

package deferred_test

import (
	"context"
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
			id, err := credits.Enqueue(b.ctx, who, credit{Amount: 10 * (i + 1), Index: i + 1})
			require.NoError(t, err)
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
		a := b.get(t, who)
		require.Equal(t, int64(150), a.Balance)
		require.Equal(t, int64(5), a.Applied)
		require.Equal(t, int64(5), a.Last)
	}
	counts, err := q.Counts(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(10), counts[deferred.StateCompleted])
}

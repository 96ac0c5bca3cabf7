package deferred_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
)

// TestEnsureIndexesFromManyProcessesAtOnce: eight queues on one jobs
// collection (eight processes starting together) each ensure the indexes at
// the same moment; each succeeds, and the collections carry every index
// once. A server that drops the connection when an index exists already
// (FerretDB v1) makes a racing creator list again.
func TestEnsureIndexesFromManyProcessesAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 8
	queues := make([]*deferred.Queue, n)
	for i := range queues {
		queues[i] = b.queue(t, nil, nil)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i, q := range queues {
		wg.Go(func() {
			<-start
			_, errs[i] = q.EnsureIndexes(b.ctx)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "queue %d", i)
	}
	names := func(coll string) []string {
		specs, err := b.db.Collection(coll).Indexes().ListSpecifications(b.ctx)
		require.NoError(t, err)
		out := make([]string, 0, len(specs))
		for _, s := range specs {
			out = append(out, s.Name)
		}
		return out
	}
	require.ElementsMatch(t, []string{"_id_", "deferred_place", "deferred_state", "deferred_expire"}, names(b.jobs.Name()))
	require.ElementsMatch(t, []string{"_id_", "deferred_pending"}, names(b.jobs.Name()+"_keys"))
}

// TestEnsureIndexesAfterALostReply: the reply to the creation of an index
// is lost (the index was made, the connection dropped, as FerretDB v1 does
// when the index exists already). EnsureIndexes lists the indexes again and
// creates only the missing ones.
func TestEnsureIndexesAfterALostReply(t *testing.T) {
	t.Parallel()
	b := setupFaulty(t, nil)
	lost := b.f.DropNextReply(mongotest.Commands([]string{"createIndexes"}, b.jobs.Name()))
	_, err := b.fqueue.EnsureIndexes(b.ctx)
	require.NoError(t, err)
	require.True(t, lost.HasFired())
	specs, err := b.jobs.Indexes().ListSpecifications(b.ctx)
	require.NoError(t, err)
	names := make([]string, 0, len(specs))
	for _, s := range specs {
		names = append(names, s.Name)
	}
	require.ElementsMatch(t, []string{"_id_", "deferred_place", "deferred_state", "deferred_expire"}, names)
}

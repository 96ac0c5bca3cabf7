package deferred_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestEnqueueHonoursItsDeadlineBehindEnsureIndexes: a context that ended is
// reported as the context's error, promptly. A Queue's first EnsureIndexes
// makes network round trips (store.Probe, listIndexes, createIndexes); an
// Enqueue that waits for it must still end with its own context (it waited
// on a mutex for as long as the other call took: 3.8 s for a 200 ms
// deadline).
func TestEnqueueHonoursItsDeadlineBehindEnsureIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	fq := b.queue(t, f.Database, nil)
	registerCredit(t, fq, b.accounts, new(atomic.Int64))
	f.Pause(4 * time.Second)
	done := make(chan error, 1)
	go func() { _, err := fq.EnsureIndexes(b.ctx); done <- err }()
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := fq.Enqueue(ctx, "credit", "ana", credit{Amount: 1})
	took := time.Since(start)
	t.Logf("Enqueue with a 200ms deadline returned after %v: %v", took, err)
	require.Less(t, took, time.Second, "Enqueue overran its deadline")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	requireOneDeferredPrefix(t, err)
	require.NoError(t, <-done, "the EnsureIndexes that held the way finished")
	n, err := b.jobs.CountDocuments(b.ctx, bson.D{})
	require.NoError(t, err)
	require.Zero(t, n, "the Enqueue that ran out of time stored nothing")
}

package idempotency_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/idempotency"
)

// TestFiftyRequestsOneKey: 50 requests with one key, from five processes
// (Keys with five owners) of ten goroutines each. Exactly one runs; it
// holds on until every other one has been told ErrInProgress; then each of
// those retries and gets the replay of the one result.
func TestFiftyRequestsOneKey(t *testing.T) {
	const processes, perProcess = 5, 10
	const n = processes * perProcess
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	procs := make([]*idempotency.Keys, processes)
	for i := range procs {
		procs[i] = b.keys(t, nil, fmt.Sprintf("process-%d", i), nil)
	}
	var (
		runs       atomic.Int32
		inProgress atomic.Int32
		allRefused = make(chan struct{})
		done       = make(chan struct{})
	)
	fn := func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		runs.Add(1)
		select {
		case <-allRefused:
		case <-ctx.Done():
			return idempotency.Result{}, ctx.Err()
		}
		return idempotency.Result{Status: 201, Body: fmt.Appendf(nil, "charged once, epoch %d", c.Epoch())}, nil
	}
	type answer struct {
		first, retry idempotency.Result
		firstErr     error
		retryErr     error
	}
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	for i := range n {
		k := procs[i%processes]
		wg.Go(func() {
			<-start
			a := &answers[i]
			a.first, a.firstErr = k.Do(ctx, "one-key", []byte("body"), fn)
			if a.firstErr == nil {
				once.Do(func() { close(done) })
				return
			}
			if inProgress.Add(1) == n-1 {
				close(allRefused)
			}
			select {
			case <-done:
			case <-ctx.Done():
				a.retryErr = ctx.Err()
				return
			}
			a.retry, a.retryErr = k.Do(ctx, "one-key", []byte("body"), fn)
		})
	}
	close(start)
	wg.Wait()

	require.Equal(t, int32(1), runs.Load(), "exactly one request ran")
	var winner *idempotency.Result
	for i := range answers {
		if answers[i].firstErr == nil {
			require.Nil(t, winner, "two requests ran")
			winner = &answers[i].first
		}
	}
	require.NotNil(t, winner)
	require.False(t, winner.Replayed)
	for i, a := range answers {
		if a.firstErr == nil {
			continue
		}
		var ip *idempotency.InProgressError
		require.ErrorAs(t, a.firstErr, &ip, "request %d", i)
		require.Equal(t, "one-key", ip.Key)
		require.Positive(t, ip.TimeLeft)
		require.Equal(t, winner.Epoch, ip.Epoch, "the holder's epoch")
		require.NoError(t, a.retryErr, "request %d", i)
		require.True(t, a.retry.Replayed, "request %d", i)
		require.Equal(t, winner.Body, a.retry.Body)
		require.Equal(t, 201, a.retry.Status)
	}
	require.Equal(t, int32(n-1), inProgress.Load())
	require.Equal(t, 1, load(t, b.coll, "one-key").Attempts)
}

package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/idempotency"
)

// setupProcesses returns the bundle, n Keys on its collection, each with an
// owner of its own as n processes would have, and a context that ends after
// two minutes.
func setupProcesses(t *testing.T, n int) (*bundle, []*idempotency.Keys, context.Context) {
	t.Helper()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	procs := make([]*idempotency.Keys, n)
	for i := range procs {
		procs[i] = b.keys(t, nil, fmt.Sprintf("process-%d", i), nil)
	}
	return b, procs, ctx
}

// TestFiftyRequestsOneKey: 50 requests with one key, from five processes
// (Keys with five owners) of ten goroutines each. Exactly one runs; it
// holds on until every other one has been told ErrInProgress; then each of
// those retries and gets the replay of the one result.
func TestFiftyRequestsOneKey(t *testing.T) {
	const nProcs, perProcess = 5, 10
	const n = nProcs * perProcess
	b, procs, ctx := setupProcesses(t, nProcs)
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
		k := procs[i%nProcs]
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

// TestFirstRequestsOfAKeyRace: two payloads race with one fresh key, from
// four processes at once (8 requests per key, 30 keys). Exactly one request
// per key runs, and no request is answered with a result made for the other
// payload: it is refused with ErrMismatch (or told ErrInProgress). On
// FerretDB v2 + DocumentDB, whose concurrent upserts of one new _id can each
// answer with the document it would have made, opening the record by upsert
// let a request see its own fingerprint instead of the stored one.
func TestFirstRequestsOfAKeyRace(t *testing.T) {
	const nProcs, perKey, keys = 4, 8, 30
	_, procs, ctx := setupProcesses(t, nProcs)
	var mismatched, inProgress, replays atomic.Int32
	for k := range keys {
		key := fmt.Sprintf("fresh-%02d", k)
		var runs atomic.Int32
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range perKey {
			body := []byte{'a' + byte(i%2)}
			wg.Go(func() {
				<-start
				res, err := procs[i%nProcs].Do(ctx, key, body, func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
					runs.Add(1)
					time.Sleep(5 * time.Millisecond)
					return idempotency.Result{Status: 201, Body: body}, nil
				})
				switch {
				case errors.Is(err, idempotency.ErrMismatch):
					mismatched.Add(1)
				case errors.Is(err, idempotency.ErrInProgress):
					inProgress.Add(1)
				case err != nil:
					t.Errorf("%s: %v", key, err)
				default:
					if res.Replayed {
						replays.Add(1)
					}
					if string(res.Body) != string(body) {
						t.Errorf("%s: a request with payload %q was answered with the result of payload %q", key, body, res.Body)
					}
				}
			})
		}
		close(start)
		wg.Wait()
		require.Equal(t, int32(1), runs.Load(), "%s: requests that ran", key)
	}
	t.Logf("%d keys: %d refused for another payload, %d told in progress, %d replays", keys, mismatched.Load(), inProgress.Load(), replays.Load())
	require.Positive(t, mismatched.Load(), "no request met the other payload's record: no race")
}

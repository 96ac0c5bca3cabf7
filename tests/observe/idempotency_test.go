package observe_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/observe"
)

// TestIdempotentRequest: the fate of each request with an idempotency key,
// through a real server: the first runs and completes, a retry is replayed,
// a request while another holds the key finds it in progress, and one with
// another payload is refused as a mismatch (a warning).
func TestIdempotentRequest(t *testing.T) {
	db := mongotest.New(t)
	ctx := t.Context()
	rec := &recorder{}
	keys, err := idempotency.New(db.Collection("keys"), &idempotency.Options{Owner: "a", TTL: time.Minute, Observer: rec})
	require.NoError(t, err)
	ok := func(context.Context, *idempotency.Call) (idempotency.Result, error) {
		return idempotency.Result{Status: 201}, nil
	}

	_, err = keys.Do(ctx, "k1", []byte("pay 10"), ok)
	require.NoError(t, err)
	res, err := keys.Do(ctx, "k1", []byte("pay 10"), ok)
	require.NoError(t, err)
	require.True(t, res.Replayed)

	started, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := keys.Do(context.Background(), "k2", []byte("pay 20"), func(context.Context, *idempotency.Call) (idempotency.Result, error) {
			close(started)
			<-release
			return idempotency.Result{Status: 201}, nil
		})
		require.NoError(t, err)
	})
	<-started
	_, err = keys.Do(ctx, "k2", []byte("pay 20"), ok)
	require.ErrorIs(t, err, idempotency.ErrInProgress)
	close(release)
	wg.Wait()

	_, err = keys.Do(ctx, "k1", []byte("pay 99"), ok)
	require.ErrorIs(t, err, idempotency.ErrMismatch)

	var lines []string
	events := rec.all()
	for i, e := range events {
		if !strings.HasPrefix(e.Kind.String(), "idempotency.") {
			continue
		}
		require.Equal(t, db.Name(), e.Database)
		require.Equal(t, "keys", e.Collection)
		s := fmt.Sprintf("%s %s id=%v", e.Kind, e.Op, e.ID)
		switch e.Kind {
		case observe.KeyCompleted:
			require.Positive(t, e.Epoch)
			require.Equal(t, "do", rec.in[i], "reported within the claim's operation")
			s += fmt.Sprintf(" attempt=%d", e.Attempt)
		case observe.KeyInProgress:
			require.Positive(t, e.TimeLeft)
			s += " holder=" + e.Holder
		default:
		}
		lines = append(lines, s)
	}
	requireLines(t, []string{
		"idempotency.completed do id=k1 attempt=1",
		"idempotency.replayed do id=k1",
		"idempotency.in_progress do id=k2 holder=a",
		"idempotency.completed do id=k2 attempt=1",
		"idempotency.mismatch do id=k1",
	}, lines)

	var counts observe.Counters
	for _, e := range events {
		counts.Observe(ctx, e)
	}
	c := counts.Counts()
	require.Equal(t, [4]int64{2, 1, 1, 1}, [4]int64{c.KeysCompleted, c.KeysReplayed, c.KeysInProgress, c.KeysMismatched})
	require.Equal(t, int64(2), counts.Count(observe.LeaseAcquired), "the claims of the two runs come to the same Observer")
	require.Equal(t, int64(1), counts.Count(observe.LeaseHeld), "and the claim that found k2 held")
}

package deferred_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/retry"
)

// TestUnfinishedListsTheKindsJobsThatMayStillRun: of one kind's jobs, a
// running one, one waiting behind it on its key and one waiting to retry
// are listed with their arguments; a completed and a cancelled one are
// not, nor another kind's.
func TestUnfinishedListsTheKindsJobsThatMayStillRun(t *testing.T) {
	b := setup(t)
	q := b.queue(t, nil, &deferred.Options{Backoff: retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour}})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	running := make(chan struct{}, 1)
	kind, err := deferred.Register(q, "kind", func(ctx context.Context, _ *deferred.Job, arg string) error {
		switch arg {
		case "running":
			running <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		case "retry":
			return errors.New("not yet")
		}
		return nil
	})
	require.NoError(t, err)
	other, err := deferred.Register(q, "other", func(context.Context, *deferred.Job, string) error { return nil })
	require.NoError(t, err)

	enqueue := func(k *deferred.Kind[string], key, arg string) bson.ObjectID {
		id, err := k.Enqueue(b.ctx, key, arg)
		require.NoError(t, err)
		return id
	}
	done := enqueue(kind, "a", "done")
	cancelled := enqueue(kind, "b", "cancelled")
	require.NoError(t, q.Cancel(b.ctx, cancelled))
	enqueue(kind, "c", "running")
	enqueue(kind, "c", "waiting")
	retried := enqueue(kind, "d", "retry")
	enqueue(other, "e", "other")
	run(t, q)
	<-running
	require.Equal(t, deferred.StateCompleted, wait(t, q, done).State)
	waitFor(t, time.Minute, "the job to retry", func() bool {
		j, err := q.Job(b.ctx, retried)
		require.NoError(t, err)
		return j.State == deferred.StateRetryable
	})

	ids := map[bson.ObjectID]string{}
	var args []string
	require.NoError(t, kind.Unfinished(b.ctx, func(id bson.ObjectID, arg string) error {
		ids[id] = arg
		args = append(args, arg)
		return nil
	}))
	slices.Sort(args)
	require.Equal(t, []string{"retry", "running", "waiting"}, args)
	require.Equal(t, "retry", ids[retried], "the job's id comes with its argument")

	stop := errors.New("stop")
	calls := 0
	err = kind.Unfinished(b.ctx, func(bson.ObjectID, string) error { calls++; return stop })
	require.ErrorIs(t, err, stop)
	require.Equal(t, 1, calls, "the first error stops it")
	require.ErrorIs(t, kind.Unfinished(b.ctx, nil), deferred.ErrInvalid)
}

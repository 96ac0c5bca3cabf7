package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/tests/internal/errmsg"
)

// TestFirstRunsRetryReplays: the first call runs and stores its result; a
// retry with the same key and fingerprint gets it back without running; the
// same key with another fingerprint is a mismatch; another scope is another
// key.
func TestFirstRunsRetryReplays(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	k := b.keys(t, nil, "a", nil)
	var runs atomic.Int32
	want := idempotency.Result{Status: 201, Header: http.Header{"Location": {"/charges/1"}, "X.Odd$Name": {"1", "2"}}, Body: []byte(`{"id":1}`)}
	fn := counting(&runs, want)

	first, err := k.Do(ctx, "key-1", []byte("charge 10"), fn)
	require.NoError(t, err)
	require.Equal(t, int32(1), runs.Load())
	require.False(t, first.Replayed)
	require.NotZero(t, first.Epoch)
	require.Equal(t, want.Body, first.Body)

	again, err := k.Do(ctx, "key-1", []byte("charge 10"), fn)
	require.NoError(t, err)
	require.Equal(t, int32(1), runs.Load(), "a replay runs nothing")
	require.True(t, again.Replayed)
	require.Equal(t, want.Status, again.Status)
	require.Equal(t, want.Header, again.Header)
	require.Equal(t, want.Body, again.Body)
	require.Equal(t, first.Epoch, again.Epoch, "the epoch of the run that produced it")

	// Another process (another owner) replays it too.
	other := b.keys(t, nil, "b", nil)
	again, err = other.Do(ctx, "key-1", []byte("charge 10"), fn)
	require.NoError(t, err)
	require.True(t, again.Replayed)

	_, err = k.Do(ctx, "key-1", []byte("charge 99"), fn)
	require.ErrorIs(t, err, idempotency.ErrMismatch)
	var mismatch *idempotency.MismatchError
	require.ErrorAs(t, err, &mismatch)
	require.Equal(t, "key-1", mismatch.Key)
	errmsg.RequireOnePrefix(t, err)
	require.Equal(t, int32(1), runs.Load())

	scoped, err := k.Do(ctx, "key-1", []byte("charge 99"), fn, idempotency.InScope("user:2"))
	require.NoError(t, err)
	require.False(t, scoped.Replayed, "the same key in another scope is another key")
	require.Equal(t, int32(2), runs.Load())
	require.Equal(t, int64(2), count(t, b.coll))

	rec := load(t, b.coll, "user:2\nkey-1")
	require.NotNil(t, rec.Result)
	require.Empty(t, rec.Lease.Owner, "released")
	require.Equal(t, 1, rec.Attempts)
}

// TestTransientIsNotStored: an error from the function is returned and not
// stored, so the retry runs again, as attempt 2; a final result with a 4xx
// status is stored and replayed.
func TestTransientIsNotStored(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	k := b.keys(t, nil, "a", nil)
	errPartner := errors.New("partner answered 503")
	var attempts []int
	fn := func(_ context.Context, c *idempotency.Call) (idempotency.Result, error) {
		attempts = append(attempts, c.Attempt())
		if c.Attempt() == 1 {
			return idempotency.Result{}, errPartner
		}
		return idempotency.Result{Status: 402, Body: []byte("card declined")}, nil
	}
	_, err := k.Do(ctx, "k", nil, fn)
	require.ErrorIs(t, err, errPartner)
	require.Equal(t, errPartner, err, "the function's error, as it returned it")
	rec := load(t, b.coll, "k")
	require.Nil(t, rec.Result)
	require.Empty(t, rec.Lease.Owner, "released after the failure")

	res, err := k.Do(ctx, "k", nil, fn)
	require.NoError(t, err)
	require.Equal(t, 402, res.Status)
	require.False(t, res.Replayed)

	res, err = k.Do(ctx, "k", nil, fn)
	require.NoError(t, err)
	require.True(t, res.Replayed, "a final 4xx is replayed")
	require.Equal(t, 402, res.Status)
	require.Equal(t, []int{1, 2}, attempts)
}

// TestInvalidInput: bad keys, scopes, contexts and functions are refused
// with typed errors, and nothing is stored.
func TestInvalidInput(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	k := b.keys(t, nil, "a", nil)
	var runs atomic.Int32
	fn := counting(&runs, idempotency.Result{Status: 200})
	for _, key := range []string{
		"",
		strings.Repeat("k", idempotency.MaxKeyLen+1),
		"$where",
		`{"$gt": ""}`,
		"a$ne",
		"tab\there",
		"new\nline",
		"naïve",
	} {
		_, err := k.Do(ctx, key, nil, fn)
		require.ErrorIs(t, err, idempotency.ErrInvalidKey, "%q", key)
		require.ErrorIs(t, err, idempotency.ErrInvalid, "%q", key)
		var ke *idempotency.KeyError
		require.ErrorAs(t, err, &ke)
		require.Equal(t, key, ke.Key)
		errmsg.RequireOnePrefix(t, err)
	}
	_, err := k.Do(ctx, strings.Repeat("k", idempotency.MaxKeyLen), nil, fn)
	require.NoError(t, err, "255 bytes is the limit, inclusive")

	_, err = k.Do(ctx, "ok", nil, fn, idempotency.InScope("nul\x00"))
	require.ErrorIs(t, err, idempotency.ErrInvalidKey)
	_, err = k.Do(ctx, "ok", nil, nil)
	require.ErrorIs(t, err, idempotency.ErrInvalid)
	errmsg.RequireOnePrefix(t, err)
	//nolint:staticcheck // a nil context is the input under test
	_, err = k.Do(nil, "ok", nil, fn)
	require.ErrorIs(t, err, idempotency.ErrInvalid)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = k.Do(cancelled, "ok", nil, fn)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, idempotency.ErrInvalid)
	errmsg.RequireOnePrefix(t, err)

	require.Equal(t, int32(1), runs.Load())
	n, err := b.coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "only the valid 255-byte key's record")

	_, err = idempotency.New(nil, nil)
	require.ErrorIs(t, err, idempotency.ErrInvalid)
	for _, o := range []idempotency.Options{
		{TTL: -time.Second},
		{Retention: time.Second, TTL: 2 * time.Second},
		{ResolveTimeout: -1},
		{Retry: retryWithNegativeInterval()},
	} {
		_, err = idempotency.New(b.coll, &o)
		require.ErrorIs(t, err, idempotency.ErrInvalid, "%+v", o)
		errmsg.RequireOnePrefix(t, err)
	}
}

// TestCheckpointsAndSteps: checkpoints are recorded in order, a name twice
// is refused, and Step runs its function once and hands it a partner key.
func TestCheckpointsAndSteps(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	k := b.keys(t, nil, "a", nil)
	var keys []string
	_, err := k.Do(ctx, "k", nil, func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		require.Empty(t, c.Last())
		require.Equal(t, "k", c.Key())
		require.NoError(t, c.Checkpoint(ctx, "reserved", []byte("seat 12")))
		err := c.Checkpoint(ctx, "reserved", nil)
		require.ErrorIs(t, err, idempotency.ErrInvalid, "a checkpoint is recorded once")
		errmsg.RequireOnePrefix(t, err)
		require.ErrorIs(t, c.Checkpoint(ctx, "", nil), idempotency.ErrInvalid)
		data, ok := c.Reached("reserved")
		require.True(t, ok)
		require.Equal(t, []byte("seat 12"), data)
		got, err := c.Step(ctx, "charged", func(_ context.Context, partnerKey string) ([]byte, error) {
			keys = append(keys, partnerKey)
			return []byte("ch_1"), nil
		})
		require.NoError(t, err)
		require.Equal(t, []byte("ch_1"), got)
		got, err = c.Step(ctx, "charged", func(context.Context, string) ([]byte, error) {
			t.Error("a step that reached its checkpoint does not run again")
			return nil, nil
		})
		require.NoError(t, err)
		require.Equal(t, []byte("ch_1"), got)
		require.Equal(t, "charged", c.Last())
		return idempotency.Result{Status: 200}, nil
	})
	require.NoError(t, err)
	rec := load(t, b.coll, "k")
	require.Len(t, rec.Points, 3, "reserved, charged began, charged")
	require.Equal(t, []string{"c:reserved", "b:charged", "c:charged"}, []string{rec.Points[0].K, rec.Points[1].K, rec.Points[2].K})
	for _, p := range rec.Points {
		require.Equal(t, rec.Epoch, p.E, "recorded under the claim that ran")
	}
	require.Len(t, keys, 1)
	require.Equal(t, rec.RID.Hex()+"-"+rec.Points[1].W.Hex(), keys[0], "the record's id and the step start's write id")
	seen := map[bson.ObjectID]bool{}
	for _, p := range rec.Points {
		require.False(t, p.W.IsZero() || seen[p.W], "every point has a write id of its own")
		seen[p.W] = true
	}
}

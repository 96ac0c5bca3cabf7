package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
)

// TestDroppedReplies: the server applies each write of a request (the
// record's creation with its claim, a checkpoint, the result with the
// release; and, for a key whose first run failed, the retry's claim and the
// start of its run) but its reply is lost. Each is settled by re-reading
// the record: the function runs exactly once after the failed run, its one
// checkpoint is recorded once, its result is stored and the claim released,
// and the retry gets the replay.
func TestDroppedReplies(t *testing.T) { eachMode(t, testDroppedReplies) }

//nolint:thelper // the body of a test, run once per mode
func testDroppedReplies(t *testing.T, mode lease.Mode) {
	b := setup(t)
	f := b.db.Faulty(t, nil)
	ctx := context.Background()
	k := b.keys(t, f.Collection(b.coll.Name()), "a", &idempotency.Options{TTL: time.Minute, Mode: mode, Clock: b.clock})
	for _, kind := range []string{"open", "claim", "begin", "checkpoint", "complete", "release"} {
		t.Run(kind, func(t *testing.T) {
			key := "dropped-" + kind
			attempts := 1
			if kind == "claim" || kind == "begin" {
				// A new key is claimed by its record's insert: these two
				// writes are a retry's, after a first run that failed.
				_, err := k.Do(ctx, key, []byte("fp"), func(context.Context, *idempotency.Call) (idempotency.Result, error) {
					return idempotency.Result{}, errFirstRun
				})
				require.ErrorIs(t, err, errFirstRun)
				attempts = 2
			}
			fault := f.DropNextReply(writeOf(b.coll.Name(), kind))
			runs := 0
			fn := func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
				runs++
				if err := c.Checkpoint(ctx, "half", []byte(kind)); err != nil {
					return idempotency.Result{}, err
				}
				return idempotency.Result{Status: 201, Body: []byte("done " + kind)}, nil
			}
			res, err := k.Do(ctx, key, []byte("fp"), fn)
			require.True(t, fault.HasFired(), "the %s reply was dropped", kind)
			require.NoError(t, err)
			require.Equal(t, 1, runs)
			require.False(t, res.Replayed)
			requireDone(t, b, key, "done "+kind, attempts)

			again, err := k.Do(ctx, key, []byte("fp"), fn)
			require.NoError(t, err)
			require.True(t, again.Replayed)
			require.Equal(t, "done "+kind, string(again.Body))
			require.Equal(t, 1, runs)
		})
	}

	t.Run("complete not applied, late copy", func(t *testing.T) {
		// The result write never reaches the server; the client gets a
		// network error, re-reads, finds no result and sends it again. The
		// first copy arrives afterwards and changes nothing.
		held := f.HoldNext(writeOf(b.coll.Name(), "complete"))
		runs := 0
		res, err := k.Do(ctx, "held-complete", nil, func(context.Context, *idempotency.Call) (idempotency.Result, error) {
			runs++
			return idempotency.Result{Status: 200, Body: []byte("once")}, nil
		})
		require.NoError(t, err)
		require.True(t, held.HasFired())
		require.Equal(t, 1, runs)
		require.Equal(t, "once", string(res.Body))
		reply, err := held.Deliver(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 0, reply.Lookup("n").AsInt64(), "the late copy matched nothing: %v", reply)
		requireDone(t, b, "held-complete", "once", 1)
	})

	t.Run("complete with a write concern error", func(t *testing.T) {
		wce := f.WriteConcernErrorNext(writeOf(b.coll.Name(), "complete"), mongotest.WriteConcernTimeout())
		res, err := k.Do(ctx, "wce-complete", nil, func(context.Context, *idempotency.Call) (idempotency.Result, error) {
			return idempotency.Result{Status: 200, Body: []byte("wce")}, nil
		})
		require.True(t, wce.HasFired())
		require.NoError(t, err, "settled by the re-read")
		require.Equal(t, "wce", string(res.Body))
		requireDone(t, b, "wce-complete", "wce", 1)
	})

	t.Run("complete unsettled", func(t *testing.T) {
		// The result's reply is lost and the re-read fails too: Do says the
		// outcome is unknown, never guesses; the retry finds the result
		// and replays it without running the function again.
		var dropped, unread *mongotest.Fault
		runs := 0
		fn := func(context.Context, *idempotency.Call) (idempotency.Result, error) {
			runs++
			dropped = f.DropNextReply(writeOf(b.coll.Name(), "complete"))
			unread = f.ErrorBeforeApply(mongotest.Commands([]string{"find"}, b.coll.Name()), mongotest.ServerError{Code: 6, CodeName: "HostUnreachable"})
			return idempotency.Result{Status: 200, Body: []byte("unsettled")}, nil
		}
		res, err := k.Do(ctx, "unsettled-complete", nil, fn)
		require.True(t, dropped.HasFired())
		require.True(t, unread.HasFired())
		require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
		require.NotErrorIs(t, err, idempotency.ErrLost, "one sentinel: the claim's end is the unknown write's own")
		var unknown *idempotency.UnknownOutcomeError
		require.ErrorAs(t, err, &unknown)
		require.Equal(t, "complete", unknown.Op)
		require.Equal(t, "unsettled", string(res.Body), "the function's result, returned with the error")

		again, err := k.Do(ctx, "unsettled-complete", nil, fn)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, "unsettled", string(again.Body))
		require.Equal(t, 1, runs)
	})

	t.Run("release unsettled", func(t *testing.T) {
		// A run fails; its release's reply is lost and the re-read fails:
		// Do returns the function's error. The release applied, so the
		// retry claims the key at once and runs the function again.
		var dropped *mongotest.Fault
		runs := 0
		fn := func(context.Context, *idempotency.Call) (idempotency.Result, error) {
			if runs++; runs == 1 {
				dropped = f.DropNextReply(writeOf(b.coll.Name(), "release"))
				f.ErrorBeforeApply(mongotest.Commands([]string{"find"}, b.coll.Name()), mongotest.ServerError{Code: 6, CodeName: "HostUnreachable"})
				return idempotency.Result{}, errFirstRun
			}
			return idempotency.Result{Status: 200, Body: []byte("kept")}, nil
		}
		_, err := k.Do(ctx, "unsettled-release", nil, fn)
		require.True(t, dropped.HasFired())
		require.ErrorIs(t, err, errFirstRun)
		res, err := k.Do(ctx, "unsettled-release", nil, fn)
		require.NoError(t, err)
		require.Equal(t, "kept", string(res.Body))
		require.Equal(t, 2, runs)
		again, err := k.Do(ctx, "unsettled-release", nil, fn)
		require.NoError(t, err)
		require.True(t, again.Replayed)
	})
}

// errFirstRun is the transient failure of a key's first run.
var errFirstRun = errors.New("first run failed")

// requireDone checks a key's record: its result, one checkpoint at most,
// attempts attempts, the claim released.
func requireDone(t *testing.T, b *bundle, key, body string, attempts int) {
	t.Helper()
	rec := load(t, b.coll, key)
	require.NotNil(t, rec.Result)
	require.Equal(t, body, string(rec.Result.Body))
	require.Equal(t, rec.Epoch, rec.Result.Epoch)
	require.Equal(t, attempts, rec.Attempts)
	require.LessOrEqual(t, len(rec.Points), 1)
	require.Empty(t, rec.Lease.Owner, "released")
}

// TestRecordGoneAtEveryOpen: the key's record (left by a run that failed)
// is deleted by another client each time right after Do read it, before the
// claim, and is back by the next read. Do opens it again twice, then gives
// up with a *RecordGoneError (the package's prefix, matching
// ErrUnknownOutcome): nothing ran, and a retry runs as the record's second
// attempt.
func TestRecordGoneAtEveryOpen(t *testing.T) { eachMode(t, testRecordGoneAtEveryOpen) }

//nolint:thelper // the body of a test, run once per mode
func testRecordGoneAtEveryOpen(t *testing.T, mode lease.Mode) {
	b := setup(t)
	f := b.db.Faulty(t, nil)
	ctx := context.Background()
	k := b.keys(t, f.Collection(b.coll.Name()), "a", &idempotency.Options{TTL: time.Minute, Mode: mode, Clock: b.clock})
	_, err := k.Do(ctx, "gone", []byte("fp"), func(context.Context, *idempotency.Call) (idempotency.Result, error) {
		return idempotency.Result{}, errFirstRun
	})
	require.ErrorIs(t, err, errFirstRun)
	saved, err := b.coll.FindOne(ctx, bson.D{{Key: "_id", Value: "gone"}}).Raw()
	require.NoError(t, err)
	var deleting atomic.Bool
	var deletes atomic.Int32
	deleting.Store(true)
	// A hook, never a fault: it runs after the server applied each command
	// through f, before its reply goes back. Do's read of the record has no
	// projection; the claim's reads (lease's) have one, or aggregate.
	f.DropNextReply(func(c *mongotest.Command) bool {
		if !deleting.Load() || c.Collection != b.coll.Name() {
			return false
		}
		s := commandText(c)
		switch {
		case c.Name == "find" && !strings.Contains(s, `"projection"`):
			// Counted only if it deleted the record (the proxy's goroutine
			// must not fail the test): the count is checked below.
			if res, err := b.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: "gone"}}); err == nil && res.DeletedCount == 1 {
				deletes.Add(1)
			}
		case c.Name == "find" || c.Name == "aggregate":
			_, _ = b.coll.InsertOne(ctx, saved)
		}
		return false
	})
	var runs atomic.Int32
	_, err = k.Do(ctx, "gone", []byte("fp"), counting(&runs, idempotency.Result{Status: 201}))
	t.Logf("Do: %v", err)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	require.True(t, strings.HasPrefix(err.Error(), "idempotency: "), "%v", err)
	require.ErrorIs(t, err, lease.ErrNotFound, "the claim's own error is kept")
	var gone *idempotency.RecordGoneError
	require.ErrorAs(t, err, &gone)
	require.Equal(t, "gone", gone.Key)
	require.Equal(t, 3, gone.Opens)
	require.Equal(t, int32(3), deletes.Load(), "opened three times, deleted after each")
	require.Zero(t, runs.Load())
	require.Nil(t, load(t, b.coll, "gone").Result)

	deleting.Store(false)
	res, err := k.Do(ctx, "gone", []byte("fp"), counting(&runs, idempotency.Result{Status: 201}))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, 2, load(t, b.coll, "gone").Attempts)
}

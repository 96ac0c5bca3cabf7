package versioned_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// setupFaulty returns a repository whose traffic passes through a fault
// proxy (retryable writes off, so a lost reply reaches the repository as the
// ambiguous error it is), the proxy's controls, and the plain bundle on the
// same collection.
func setupFaulty[T any](t *testing.T, opts *versioned.Options) (*versioned.Repo[T], *mongotest.Faulty, *bundle) {
	t.Helper()
	_, b := setup[T](t, opts)
	f := b.db.Faulty(t, nil)
	repo, err := versioned.New[T](f.Collection(b.coll.Name()), opts)
	require.NoError(t, err)
	return repo, f, b
}

// dropNextWrite arms the fault: the next write to the collection is applied
// by the server and its reply lost.
func dropNextWrite(f *mongotest.Faulty, b *bundle) *mongotest.Fault {
	return f.DropNextReply(mongotest.Writes(b.coll.Name()))
}

// requireDropped checks that the fault really acted: one write was applied
// and its reply dropped.
func requireDropped(t *testing.T, fault *mongotest.Fault) {
	t.Helper()
	require.True(t, fault.HasFired(), "the reply was dropped")
	require.Len(t, fault.Dropped(), 1)
}

func TestLostReplyModifyAddsExactlyOnce(t *testing.T) {
	t.Parallel()
	repo, f, b := setupFaulty[account](t, nil)
	ins := &account{ID: "w", Balance: 100}
	require.NoError(t, repo.Insert(b.ctx, ins))

	fault := dropNextWrite(f, b)
	calls := 0
	got, err := repo.Modify(b.ctx, "w", func(a *account) error {
		calls++
		a.Balance += 10
		return nil
	})
	require.NoError(t, err)
	requireDropped(t, fault)
	write := "update"
	if b.db.Server.Caps.UpdatePipelines {
		write = "findAndModify" // the CAS write's pipeline form
	}
	require.Equal(t, write, fault.Dropped()[0].Name)
	require.Equal(t, 1, calls, "the write landed: fn was not run again")
	require.Equal(t, int64(110), got.Balance)
	require.Equal(t, ins.Version+1, got.Version)
	m := b.raw(t, "w")
	require.Equal(t, int64(110), m["balance"], "+10 applied exactly once")
	require.Equal(t, ins.Version+1, m["version"])
}

func TestLostReplyUpdateAppliesOnce(t *testing.T) {
	t.Parallel()
	repo, f, b := setupFaulty[account](t, nil)
	a := &account{ID: "w", Balance: 100}
	require.NoError(t, repo.Insert(b.ctx, a))
	v0 := a.Version

	fault := dropNextWrite(f, b)
	a.Balance += 10
	require.NoError(t, repo.Update(b.ctx, a))
	requireDropped(t, fault)
	require.Equal(t, v0+1, a.Version, "the copy carries the new version")
	m := b.raw(t, "w")
	require.Equal(t, int64(110), m["balance"])
	require.Equal(t, v0+1, m["version"])
}

func TestLostReplyGuardedAppliesOnce(t *testing.T) {
	t.Parallel()
	repo, f, b := setupFaulty[item](t, nil)
	ins := &item{SKU: "s", Stock: 10}
	require.NoError(t, repo.Insert(b.ctx, ins))

	fault := dropNextWrite(f, b)
	got, err := repo.Guarded(b.ctx, "s", bson.M{"stock": bson.M{"$gte": 3}}, bson.M{"$inc": bson.M{"stock": -3}})
	require.NoError(t, err)
	requireDropped(t, fault)
	require.Equal(t, "findAndModify", fault.Dropped()[0].Name)
	require.Equal(t, &item{SKU: "s", Stock: 7, Version: ins.Version + 1}, got)
	m := b.raw(t, "s")
	require.Equal(t, int64(7), m["stock"], "-3 applied exactly once")
	require.Equal(t, ins.Version+1, m["version"])
}

func TestLostReplyInsertAndDelete(t *testing.T) {
	t.Parallel()
	repo, f, b := setupFaulty[account](t, nil)

	fault := dropNextWrite(f, b)
	a := &account{ID: "w", Balance: 1}
	require.NoError(t, repo.Insert(b.ctx, a), "the insert landed: not a duplicate of itself")
	requireDropped(t, fault)
	require.Equal(t, "insert", fault.Dropped()[0].Name)
	require.Equal(t, a.Version, b.raw(t, "w")["version"])
	require.Equal(t, int64(1), b.count(t))

	fault = dropNextWrite(f, b)
	require.NoError(t, repo.Delete(b.ctx, a))
	requireDropped(t, fault)
	require.Equal(t, int64(0), b.count(t))
}

// TestWriteThatNeverArrivedIsSentAgain: the request is held in the proxy and
// its connection reset, so the server never sees it while the client gets a
// network error. The re-read finds the document unchanged, so the same write
// (same write id, same version filter) is sent again, and lands once.
func TestWriteThatNeverArrivedIsSentAgain(t *testing.T) {
	t.Parallel()
	repo, f, b := setupFaulty[account](t, nil)
	items, err := versioned.New[item](f.Collection(b.coll.Name()), nil)
	require.NoError(t, err)
	a := &account{ID: "w", Balance: 100}
	require.NoError(t, repo.Insert(b.ctx, a))
	s := &item{SKU: "s", Stock: 10}
	require.NoError(t, items.Insert(b.ctx, s))
	start := map[string]int64{"w": a.Version, "s": s.Version}
	_, err = items.Get(b.ctx, "s") // so that Guarded knows the version without reading
	require.NoError(t, err)

	for _, op := range []struct {
		id    string
		write func() error
	}{
		{"w", func() error { a.Balance += 10; return repo.Update(b.ctx, a) }},
		{"s", func() error {
			_, err := items.Guarded(b.ctx, "s", bson.M{"stock": bson.M{"$gte": 3}}, bson.M{"$inc": bson.M{"stock": -3}})
			return err
		}},
	} {
		// The pause outlasts the check below by far: on a loaded machine the
		// check's own read, queued behind other tests in the serializing
		// proxy, took more than 500 ms, the pause ended and the held write
		// landed before it was looked for.
		f.Pause(2 * time.Second)
		done := make(chan error, 1)
		go func() { done <- op.write() }()
		time.Sleep(150 * time.Millisecond) // the write is now held in the proxy
		require.Equal(t, start[op.id], b.raw(t, op.id)["version"], "the held write has not reached the server")
		require.Positive(t, f.ResetConnections())
		require.NoError(t, <-done, op.id)
	}
	m := b.raw(t, "w")
	require.Equal(t, int64(110), m["balance"])
	require.Equal(t, start["w"]+1, m["version"])
	require.Equal(t, start["w"]+1, a.Version)
	m = b.raw(t, "s")
	require.Equal(t, int64(7), m["stock"])
	require.Equal(t, start["s"]+1, m["version"])
}

// TestUnknownOutcomeIsNotGuessed: the write lands but its reply is lost,
// and meanwhile other writers move the document on by more than WriteIDs
// writes, pushing its write id out. The repository cannot tell whether its
// write landed, and says so instead of retrying (which would apply +10 a
// second time).
func TestUnknownOutcomeIsNotGuessed(t *testing.T) {
	t.Parallel()
	repo, f, b := setupFaulty[account](t, nil)
	others, err := versioned.New[account](b.coll, nil)
	require.NoError(t, err)
	ins := &account{ID: "w", Balance: 100}
	require.NoError(t, repo.Insert(b.ctx, ins))

	fault := dropWriteAfter(f, b.coll.Name(), func() {
		for range versioned.WriteIDs + 5 { // Modify keeps the bound on every server
			_, err := others.Modify(b.ctx, "w", func(a *account) error { a.Balance++; return nil })
			require.NoError(t, err)
		}
	})
	calls := 0
	_, err = repo.Modify(b.ctx, "w", func(a *account) error { calls++; a.Balance += 10; return nil })
	require.True(t, fault.HasFired())

	require.ErrorIs(t, err, versioned.ErrUnknownOutcome)
	var ue *versioned.UnknownOutcomeError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, "modify", ue.Op)
	require.NotEmpty(t, ue.WriteID)
	require.Equal(t, ins.Version, ue.Base)
	require.Greater(t, ue.Current, ue.Base+versioned.WriteIDs)
	require.True(t, store.IsAmbiguous(err), "the write's own error stays reachable")
	require.False(t, retry.IsRetryable(err), "an unknown outcome must not be retried blindly")
	require.Equal(t, 1, calls)
	require.Equal(t, int64(100+10+versioned.WriteIDs+5), b.raw(t, "w")["balance"], "the write had landed once: a retry would have added 10 more")
}

// TestLostRepliesUnderContention: 4 writers × 25 increments through the
// fault proxy while 10 replies are dropped: every increment applies once.
func TestLostRepliesUnderContention(t *testing.T) {
	t.Parallel()
	const workers, each, drops = 4, 25, 10
	repo, f, b := setupFaulty[account](t, &versioned.Options{Retry: patient})
	ins := &account{ID: "w"}
	require.NoError(t, repo.Insert(b.ctx, ins))

	fault := f.DropReplies(drops, mongotest.Writes(b.coll.Name()))
	var acked atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				if _, err := repo.Modify(b.ctx, "w", func(a *account) error { a.Balance++; return nil }); err != nil {
					t.Errorf("modify: %v", err)
					return
				}
				acked.Add(1)
			}
		})
	}
	wg.Wait()
	require.True(t, fault.HasFired())
	require.Len(t, fault.Dropped(), drops)
	require.Equal(t, int64(workers*each), acked.Load())
	m := b.raw(t, "w")
	require.Equal(t, int64(workers*each), m["balance"])
	require.Equal(t, ins.Version+workers*each, m["version"])
}

// A Modify under a guard whose guarded read misses re-reads to tell a failed
// guard from a missing document; when that re-read fails, the answer is the
// failure (retried), never "not found" for a document that exists.
func TestModifyGuardMissWithFailedRereadIsNotNotFound(t *testing.T) {
	t.Parallel()
	repo, f, b := setupFaulty[account](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &account{ID: "g", Balance: 5}))

	var finds atomic.Int64
	fault := f.DropNextReply(func(c *mongotest.Command) bool {
		// The first find is the guarded read; drop the reply of the second,
		// the re-read.
		return c.Name == "find" && c.Collection == b.coll.Name() && finds.Add(1) == 2
	})
	_, err := repo.Modify(b.ctx, "g", func(a *account) error {
		a.Balance++
		return nil
	}, versioned.Where(bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: 100}}}}))
	require.True(t, fault.HasFired(), "the re-read's reply was dropped")
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	require.NotErrorIs(t, err, versioned.ErrNotFound, "the document exists")
	require.Equal(t, int64(5), b.raw(t, "g")["balance"], "nothing written")
}

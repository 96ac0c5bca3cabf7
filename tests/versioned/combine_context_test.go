package versioned_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

// TestCombinedModifyHonoursEachCallersContext: a call combined into a batch
// is committed only when its own fn starts. B waits in a batch behind A,
// whose fn is slow; B's context ends while A's fn runs. B returns its
// context's error at once, as it would alone or still waiting in line: its
// fn never runs, and nothing of it is written (the write is X's and A's
// alone: one version each).
func TestCombinedModifyHonoursEachCallersContext(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	start := &account{ID: "a", Owner: "o"}
	require.NoError(t, repo.Insert(b.ctx, start))

	// X leads the first batch and holds it until A and B wait behind it.
	// xIn has room for the signal: X's fn may run before this goroutine
	// waits on it, and a retried fn must not block on it.
	xIn, xGo := make(chan struct{}, 1), make(chan struct{})
	xDone := make(chan error, 1)
	go func() {
		_, err := repo.Modify(b.ctx, "a", func(a *account) error {
			select {
			case xIn <- struct{}{}:
			default:
			}
			<-xGo
			a.Balance += 1
			return nil
		})
		xDone <- err
	}()
	<-xIn
	// A's fn is slow (3 s); B has a 500 ms deadline.
	aDone := make(chan error, 1)
	go func() {
		_, err := repo.Modify(b.ctx, "a", func(a *account) error {
			time.Sleep(3 * time.Second)
			a.Balance += 10
			return nil
		})
		aDone <- err
	}()
	time.Sleep(100 * time.Millisecond) // A is in line before B
	const deadline = 500 * time.Millisecond
	bctx, cancel := context.WithTimeout(b.ctx, deadline)
	defer cancel()
	type res struct {
		took time.Duration
		err  error
	}
	var bRan atomic.Bool
	bDone := make(chan res, 1)
	go func() {
		begin := time.Now()
		_, err := repo.Modify(bctx, "a", func(a *account) error {
			bRan.Store(true)
			a.Balance += 100
			return nil
		})
		bDone <- res{time.Since(begin), err}
	}()
	time.Sleep(100 * time.Millisecond) // B is in line behind A
	close(xGo)
	require.NoError(t, <-xDone)
	r := <-bDone
	require.NoError(t, <-aDone)
	got, err := repo.Get(b.ctx, "a")
	require.NoError(t, err)
	t.Logf("B (deadline %v): returned after %v with err=%v; its fn ran: %v; balance now %d", deadline, r.took, r.err, bRan.Load(), got.Balance)
	require.ErrorIs(t, r.err, context.DeadlineExceeded, "B's context ended before its fn started")
	require.Less(t, r.took, deadline+time.Second, "B's context was not honoured: it waited for another call's fn")
	require.False(t, bRan.Load(), "B's fn ran after B's context ended")
	require.Equal(t, int64(11), got.Balance, "B's change was written")
	require.Equal(t, start.Version+2, got.Version, "one version each for X and A, none for B")
}

// TestCombinedModifyLeaderContextEndsBeforeItsFn: the call leading a batch
// reads for the batch on a context that lives while any of its calls does.
// L leads a batch with M; L's context ends during the (delayed) read, before
// L's fn's turn. L's fn does not run and L returns its context's error; M's
// change alone is written.
func TestCombinedModifyLeaderContextEndsBeforeItsFn(t *testing.T) {
	t.Parallel()
	_, b := setup[account](t, nil)
	f := b.db.Faulty(t, nil)
	repo, err := versioned.New[account](f.Collection("docs"), nil)
	require.NoError(t, err)
	start := &account{ID: "a", Owner: "o"}
	require.NoError(t, repo.Insert(b.ctx, start))

	// X leads the first batch and holds it until L and M wait behind it.
	// xIn has room for the signal: X's fn may run before this goroutine
	// waits on it, and a retried fn must not block on it.
	xIn, xGo := make(chan struct{}, 1), make(chan struct{})
	xDone := make(chan error, 1)
	go func() {
		_, err := repo.Modify(b.ctx, "a", func(a *account) error {
			select {
			case xIn <- struct{}{}:
			default:
			}
			<-xGo
			a.Balance += 1
			return nil
		})
		xDone <- err
	}()
	<-xIn
	const deadline = 300 * time.Millisecond
	lctx, cancel := context.WithTimeout(b.ctx, deadline)
	defer cancel()
	var lRan atomic.Bool
	lDone := make(chan error, 1)
	go func() {
		_, err := repo.Modify(lctx, "a", func(a *account) error {
			lRan.Store(true)
			a.Balance += 100
			return nil
		})
		lDone <- err
	}()
	time.Sleep(100 * time.Millisecond) // L is in line before M
	mDone := make(chan error, 1)
	go func() {
		_, err := repo.Modify(b.ctx, "a", func(a *account) error {
			a.Balance += 10
			return nil
		})
		mDone <- err
	}()
	time.Sleep(100 * time.Millisecond) // M is in line behind L
	// The read of L's batch outlasts L's deadline.
	stop := f.DelayReplies(time.Second, mongotest.Commands([]string{"find"}, "docs"))
	defer stop()
	close(xGo)
	require.NoError(t, <-xDone)
	lErr := <-lDone
	require.NoError(t, <-mDone)
	got, err := repo.Get(b.ctx, "a")
	require.NoError(t, err)
	t.Logf("L (deadline %v): err=%v; its fn ran: %v; balance now %d", deadline, lErr, lRan.Load(), got.Balance)
	require.ErrorIs(t, lErr, context.DeadlineExceeded, "L's context ended before its fn's turn")
	require.False(t, lRan.Load(), "L's fn ran after L's context ended")
	require.Equal(t, int64(11), got.Balance, "L's change was written")
	require.Equal(t, start.Version+2, got.Version, "one version each for X and M, none for L")
}

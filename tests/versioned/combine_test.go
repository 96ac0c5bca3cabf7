package versioned_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// Combining: Modify calls on one document in one process wait in line, and
// the call at the head of the line reads once, applies every queued fn in
// turn and writes once. These tests check that, with the default policy,
// every call completes; that the counter equals the acknowledged
// increments; that each call gets the state its own fn left, at a version
// of its own; that an fn returning an error writes nothing; and that calls
// in one process never conflict with each other.

var errPoison = errors.New("poisoned change")

// commandCounter counts the commands a client sends, by name.
type commandCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *commandCounter) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		c.mu.Lock()
		c.n[e.CommandName]++
		c.mu.Unlock()
	}}
}

// snapshot returns the counts so far.
func (c *commandCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// since returns the commands sent since the snapshot base, heartbeats and
// handshakes left out.
func (c *commandCounter) since(base map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range c.snapshot() {
		switch k {
		case "hello", "isMaster", "ping", "endSessions":
			continue
		}
		if d := v - base[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func (c *commandCounter) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

// client connects a client of its own to the test's server and returns the
// test collection through it: another process, to the server and to the
// lines Modify calls wait in.
func client(t *testing.T, b *bundle, counter *commandCounter) *mongo.Collection {
	t.Helper()
	var opts *store.Options
	if counter != nil {
		opts = &store.Options{ClientOptions: options.Client().SetMonitor(counter.monitor())}
	}
	s, err := store.Connect(b.ctx, b.db.Server.URI, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s.Database(b.db.Name()).Collection(b.coll.Name())
}

// tally collects what the calls returned.
type tally struct {
	mu       sync.Mutex
	acked    int64
	balances []int64 // the balance each successful increment returned
	errs     []error // unexpected errors
}

func (ty *tally) ok(start int64, a *account) {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	ty.acked++
	ty.balances = append(ty.balances, a.Balance)
	if a.Version-start != a.Balance {
		ty.errs = append(ty.errs, errors.New("a returned document is not at the version of its own change"))
	}
	if a.Note != "" {
		ty.errs = append(ty.errs, errors.New("a returned document carries a poisoned change"))
	}
}

// increment adds 1 to the balance of "hot" through repo and records the
// outcome; it reports whether the call succeeded.
func (ty *tally) increment(ctx context.Context, repo *versioned.Repo[account], start int64) bool {
	a, err := repo.Modify(ctx, "hot", func(a *account) error { a.Balance++; return nil })
	if err != nil {
		ty.fail(err)
		return false
	}
	ty.ok(start, a)
	return true
}

func (ty *tally) fail(err error) {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	ty.errs = append(ty.errs, err)
}

// check requires the exact invariants: the counter is the number of
// acknowledged increments, at one version each, and the balances returned
// are 1..n, each once: every call got the state its own change made.
func (ty *tally) check(t *testing.T, repo *versioned.Repo[account], b *bundle, start int64) {
	t.Helper()
	require.Empty(t, ty.errs)
	got, err := repo.Get(b.ctx, "hot")
	require.NoError(t, err)
	require.Equal(t, ty.acked, got.Balance, "the counter is the acknowledged increments")
	require.Equal(t, start+ty.acked, got.Version, "one version per increment")
	require.Empty(t, got.Note, "no poisoned change was written")
	slices.Sort(ty.balances)
	for i, bal := range ty.balances {
		require.Equal(t, int64(i+1), bal, "each increment returned the state it made, once")
	}
}

// TestCombinedModifyOneProcess: 32 goroutines × 40 calls on one document
// through one Repo, with the default policy: every third call's fn makes a
// change and then returns an error, every fifth changes nothing. Every
// increment completes, with the exact invariants; each poisoned call
// returns its error; no call conflicts (the process's calls wait in line),
// so each fn runs exactly once; and fewer updates are sent than
// increments acknowledged.
func TestCombinedModifyOneProcess(t *testing.T) {
	t.Parallel()
	const workers, each = 32, 40
	var retries atomic.Int64
	_, b := setup[account](t, nil)
	counter := &commandCounter{n: map[string]int{}}
	coll := client(t, b, counter)
	repo, err := versioned.New[account](coll, &versioned.Options{Retry: retry.Policy{OnRetry: func(retry.Attempt) { retries.Add(1) }}})
	require.NoError(t, err)
	hot := &account{ID: "hot"}
	require.NoError(t, repo.Insert(b.ctx, hot))

	var (
		ty              tally
		calls, poisoned atomic.Int64
		readOnly        atomic.Int64
		wg              sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				switch n := w*each + i; {
				case n%3 == 0:
					_, err := repo.Modify(b.ctx, "hot", func(a *account) error {
						calls.Add(1)
						a.Balance += 1000
						a.Note = "poison"
						return errPoison
					})
					if !errors.Is(err, errPoison) {
						ty.fail(err)
					}
					poisoned.Add(1)
				case n%5 == 0:
					a, err := repo.Modify(b.ctx, "hot", func(a *account) error {
						calls.Add(1)
						return nil
					})
					if err != nil {
						ty.fail(err)
						continue
					}
					if a.Version-hot.Version != a.Balance {
						ty.fail(errors.New("a read-only call returned an inconsistent state"))
					}
					readOnly.Add(1)
				default:
					a, err := repo.Modify(b.ctx, "hot", func(a *account) error {
						calls.Add(1)
						a.Balance++
						return nil
					})
					if err != nil {
						ty.fail(err)
						continue
					}
					ty.ok(hot.Version, a)
				}
			}
		})
	}
	wg.Wait()
	ty.check(t, repo, b, hot.Version)
	updates := counter.get("update")
	t.Logf("%d increments, %d poisoned, %d read-only: %d fn calls, %d updates, %d finds, %d retries",
		ty.acked, poisoned.Load(), readOnly.Load(), calls.Load(), updates, counter.get("find"), retries.Load())
	require.Equal(t, int64(workers*each), ty.acked+poisoned.Load()+readOnly.Load(), "every call completed")
	require.Zero(t, retries.Load(), "calls of one process never conflict with each other")
	require.Equal(t, int64(workers*each), calls.Load(), "each fn ran exactly once")
	require.Less(t, updates, int(ty.acked), "calls were combined")
}

// TestCombinedModifyManyRepos: four Repos on one collection of one client
// share the line: 4 × 8 goroutines × 25 increments, no conflict, exact
// counts.
func TestCombinedModifyManyRepos(t *testing.T) {
	t.Parallel()
	const repos, workers, each = 4, 8, 25
	var retries atomic.Int64
	p := retry.Policy{OnRetry: func(retry.Attempt) { retries.Add(1) }}
	first, b := setup[account](t, &versioned.Options{Retry: p})
	hot := &account{ID: "hot"}
	require.NoError(t, first.Insert(b.ctx, hot))
	var ty tally
	var wg sync.WaitGroup
	for range repos {
		repo, err := versioned.New[account](b.coll, &versioned.Options{Retry: p})
		require.NoError(t, err)
		for range workers {
			wg.Go(func() {
				for range each {
					if !ty.increment(b.ctx, repo, hot.Version) {
						return
					}
				}
			})
		}
	}
	wg.Wait()
	ty.check(t, first, b, hot.Version)
	require.Equal(t, int64(repos*workers*each), ty.acked)
	require.Zero(t, retries.Load(), "Repos on one collection of one client share the line")
}

// TestModifyAcrossProcessesDefaultPolicy: 16 writers in 4 processes (4
// clients of their own, 4 goroutines each) × 40 increments of one document,
// with the default policy: the version check arbitrates between the
// processes, and every call completes, with the exact invariants. Where the
// server runs update pipelines, first conflicts are retried at once from
// the document the failed write returned, combined batches included.
func TestModifyAcrossProcessesDefaultPolicy(t *testing.T) {
	t.Parallel()
	const procs, workers, each = 4, 4, 40
	_, b := setup[account](t, nil)
	var retries, atOnce atomic.Int64
	p := retry.Policy{OnRetry: func(a retry.Attempt) {
		retries.Add(1)
		if a.Delay == 0 {
			atOnce.Add(1)
			t.Logf("retried at once after attempt %d: %v", a.Number, a.Err)
		}
	}}
	var (
		ty    tally
		wg    sync.WaitGroup
		start int64
	)
	for i := range procs {
		repo, err := versioned.New[account](client(t, b, nil), &versioned.Options{Retry: p})
		require.NoError(t, err)
		if i == 0 {
			hot := &account{ID: "hot"}
			require.NoError(t, repo.Insert(b.ctx, hot))
			start = hot.Version
		}
		for range workers {
			wg.Go(func() {
				for range each {
					if !ty.increment(b.ctx, repo, start) {
						return
					}
				}
			})
		}
	}
	wg.Wait()
	repo, err := versioned.New[account](b.coll, nil)
	require.NoError(t, err)
	ty.check(t, repo, b, start)
	t.Logf("%d increments, %d retries, %d of them at once", ty.acked, retries.Load(), atOnce.Load())
	require.Equal(t, int64(procs*workers*each), ty.acked, "every call completed")
	if b.db.Server.Caps.UpdatePipelines {
		// Combined batches went through the retry from the returned
		// document, and the invariants above still hold.
		require.Positive(t, atOnce.Load(), "first conflicts retried at once")
	} else {
		require.Zero(t, atOnce.Load(), "no returned document, no retry at once")
	}
}

// TestCombinedModifyCallersLeave: 16 goroutines increment one document,
// half of their calls with a context that ends after a random short time.
// A call that returns its context's error wrote nothing; one that returns
// an unknown outcome may have; every other returns the state it made. The
// counter is at least the acknowledged increments and at most that plus
// the unknown ones, and the returned states are distinct.
func TestCombinedModifyCallersLeave(t *testing.T) {
	t.Parallel()
	const workers, each = 16, 30
	repo, b := setup[account](t, nil)
	hot := &account{ID: "hot"}
	require.NoError(t, repo.Insert(b.ctx, hot))
	var (
		ty              tally
		left, uncertain atomic.Int64
		wg              sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				ctx, cancel := b.ctx, context.CancelFunc(func() {})
				if (w+i)%2 == 0 {
					ctx, cancel = context.WithTimeout(b.ctx, time.Duration(1+(w*i)%7)*time.Millisecond)
				}
				a, err := repo.Modify(ctx, "hot", func(a *account) error { a.Balance++; return nil })
				cancel()
				switch {
				case err == nil:
					ty.ok(hot.Version, a)
				case errors.Is(err, versioned.ErrUnknownOutcome):
					uncertain.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					left.Add(1)
				default:
					ty.fail(err)
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, ty.errs)
	got, err := repo.Get(b.ctx, "hot")
	require.NoError(t, err)
	t.Logf("%d increments acknowledged, %d left on their context, %d unknown; counter %d", ty.acked, left.Load(), uncertain.Load(), got.Balance)
	require.Equal(t, int64(workers*each), ty.acked+left.Load()+uncertain.Load())
	require.GreaterOrEqual(t, got.Balance, ty.acked)
	require.LessOrEqual(t, got.Balance, ty.acked+uncertain.Load())
	require.Equal(t, hot.Version+got.Balance, got.Version, "one version per increment")
	slices.Sort(ty.balances)
	for i := 1; i < len(ty.balances); i++ {
		require.NotEqual(t, ty.balances[i-1], ty.balances[i], "two calls returned the same state")
	}
}

// TestCombinedModifyPanickingFn: 16 goroutines increment one document while
// every seventh call's fn panics. The panic reaches the goroutine of the
// call whose fn panicked (whichever goroutine ran it), nothing of it is
// written, and the other calls complete with the exact invariants.
func TestCombinedModifyPanickingFn(t *testing.T) {
	t.Parallel()
	const workers, each = 16, 21
	repo, b := setup[account](t, nil)
	hot := &account{ID: "hot"}
	require.NoError(t, repo.Insert(b.ctx, hot))
	var (
		ty     tally
		panics atomic.Int64
		wg     sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				mine := w*each + i
				if mine%7 == 0 {
					func() {
						defer func() {
							if v := recover(); v != nil {
								if v != any(mine) {
									ty.fail(errors.New("a panic reached the wrong call"))
								}
								panics.Add(1)
							}
						}()
						_, err := repo.Modify(b.ctx, "hot", func(a *account) error {
							a.Balance += 1000
							a.Note = "poison"
							panic(mine)
						})
						ty.fail(err) // not reached
					}()
					continue
				}
				ty.increment(b.ctx, repo, hot.Version)
			}
		})
	}
	wg.Wait()
	ty.check(t, repo, b, hot.Version)
	require.Equal(t, int64(workers*each/7), panics.Load())
	require.Equal(t, int64(workers*each-workers*each/7), ty.acked)
}

// TestCombinedModifyMissingDocument: calls combined on a document that does
// not exist each get ErrNotFound, and no fn runs.
func TestCombinedModifyMissingDocument(t *testing.T) {
	t.Parallel()
	const workers = 16
	repo, b := setup[account](t, nil)
	var calls, notFound atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range 5 {
				_, err := repo.Modify(b.ctx, "absent", func(a *account) error { calls.Add(1); a.Balance++; return nil })
				if errors.Is(err, versioned.ErrNotFound) {
					notFound.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(workers*5), notFound.Load())
	require.Zero(t, calls.Load())
	require.Zero(t, b.count(t))
}

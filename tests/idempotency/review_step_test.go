package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/mongotest"
)

// stepBegin matches the update that records the start of step name.
func stepBegin(coll, name string) mongotest.Match {
	return func(c *mongotest.Command) bool {
		return c.Collection == coll && c.Name == "update" && strings.Contains(commandText(c), `"b:`+name+`"`)
	}
}

// hasPoint reports whether the record id holds the point k (read directly,
// not through the fault proxy).
func hasPoint(t *testing.T, b *bundle, id, k string) bool {
	t.Helper()
	for _, p := range load(t, b.coll, id).Points {
		if p.K == k {
			return true
		}
	}
	return false
}

var errPartnerTimeout = errors.New("partner did not answer")

// TestReviewStepPartnerKeyStableAcrossRuns: Call is documented safe for
// concurrent use, and Step's partnerKey "is the same in every run that
// resumes the step". Two steps begun concurrently in one run whose writes
// reach the server in one order and whose replies come back in the other
// get partner keys built from the local (reply) order; the retry rebuilds
// them from the record's (server) order: each step's partner key changes
// between the runs, so the partner cannot tell the retry's call is the same
// one, and applies it twice.
func TestReviewStepPartnerKeyStableAcrossRuns(t *testing.T) {
	b := setup(t)
	f := b.db.Faulty(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k := b.keys(t, f.Collection(b.coll.Name()), "first", nil)
	p := newPartner()

	first := map[string]string{}
	var mu sync.Mutex
	stepFn := func(name string, keys map[string]string) func(context.Context, string) ([]byte, error) {
		return func(_ context.Context, pk string) ([]byte, error) {
			p.call(name, pk)
			mu.Lock()
			keys[name] = pk
			mu.Unlock()
			return nil, errPartnerTimeout // the partner acted; its reply was lost
		}
	}
	_, err := k.Do(ctx, "pay-7", nil, func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		// (stop does not cut short a reply already being delayed, so the
		// delay is short: if y's step ever took longer, the replies would
		// come back in order and the test would pass, never fail falsely.)
		stop := f.DelayReplies(5*time.Second, stepBegin(b.coll.Name(), "x"))
		var wg sync.WaitGroup
		var xErr error
		wg.Go(func() { _, xErr = c.Step(ctx, "x", stepFn("x", first)) })
		// b:x is applied on the server (its reply is held at the proxy).
		require.Eventually(t, func() bool { return hasPoint(t, b, "pay-7", "b:x") }, time.Minute, 5*time.Millisecond)
		_, yErr := c.Step(ctx, "y", stepFn("y", first))
		stop() // now b:x's reply arrives
		wg.Wait()
		require.ErrorIs(t, xErr, errPartnerTimeout)
		require.ErrorIs(t, yErr, errPartnerTimeout)
		return idempotency.Result{}, errPartnerTimeout
	})
	require.ErrorIs(t, err, errPartnerTimeout)

	second := map[string]string{}
	res, err := b.keys(t, nil, "retry", nil).Do(ctx, "pay-7", nil, func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		for _, name := range []string{"x", "y"} {
			if _, err := c.Step(ctx, name, func(ctx context.Context, pk string) ([]byte, error) {
				p.call(name, pk)
				second[name] = pk
				return []byte("ok"), nil
			}); err != nil {
				return idempotency.Result{}, err
			}
		}
		return idempotency.Result{Status: 200}, nil
	})
	require.NoError(t, err)
	require.Equal(t, 200, res.Status)
	require.Equal(t, first["x"], second["x"], "step x resumed with the partner key it began with")
	require.Equal(t, first["y"], second["y"], "step y resumed with the partner key it began with")
	require.Equal(t, map[string]int{"x": 1, "y": 1}, p.effects, "each partner effect once")
}

// TestReviewStepConcurrentSameNameRunsOnce: "Step runs fn once for the step
// name across every run of the key", and Call is safe for concurrent use.
// Two goroutines of one run calling Step with one name: the second's write
// of the step's start matches nothing (the first's is there), its re-read
// finds the point with its own epoch and takes it for its own write, so
// both calls run fn: the partner is called twice by one run.
func TestReviewStepConcurrentSameNameRunsOnce(t *testing.T) {
	b := setup(t)
	f := b.db.Faulty(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k := b.keys(t, f.Collection(b.coll.Name()), "one", nil)
	var (
		mu    sync.Mutex
		calls int
	)
	charge := func(context.Context, string) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return []byte("ch_1"), nil
	}
	_, err := k.Do(ctx, "pay-8", nil, func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		// A short delay (see TestReviewStepPartnerKeyStableAcrossRuns): if the
		// second Step were slower than it, the test would pass, never fail
		// falsely.
		stop := f.DelayReplies(5*time.Second, stepBegin(b.coll.Name(), "charge"))
		defer stop()
		var wg sync.WaitGroup
		var aErr error
		wg.Go(func() { _, aErr = c.Step(ctx, "charge", charge) })
		require.Eventually(t, func() bool { return hasPoint(t, b, "pay-8", "b:charge") }, time.Minute, 5*time.Millisecond)
		_, bErr := c.Step(ctx, "charge", charge)
		wg.Wait()
		t.Logf("first Step: %v; second Step: %v", aErr, bErr)
		return idempotency.Result{Status: 200}, nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, calls, "the step's fn ran once")
}

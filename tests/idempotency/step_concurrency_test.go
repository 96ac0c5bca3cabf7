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

// TestStepPartnerKeyIsStableAcrossRuns: Call is documented safe for
// concurrent use, and Step's partnerKey "is the same in every run that
// resumes the step". Two steps begun concurrently in one run whose writes
// reach the server in one order and whose replies come back in the other
// get partner keys built from the local (reply) order; the retry rebuilds
// them from the record's (server) order: each step's partner key changes
// between the runs, so the partner cannot tell the retry's call is the same
// one, and applies it twice.
func TestStepPartnerKeyIsStableAcrossRuns(t *testing.T) {
	b, f, k, ctx := faultyRun(t, "first")
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
		// b:x's reply is held until stop (which releases a reply being held).
		stop := f.DelayReplies(time.Hour, stepBegin(b.coll.Name(), "x"))
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

// TestStepOfOneNameCalledConcurrentlyRunsOnce: "Step runs fn once for the step
// name across every run of the key", and Call is safe for concurrent use.
// Two goroutines of one run calling Step with one name: the second's write
// of the step's start matches nothing (the first's is there), its re-read
// finds the point with its own epoch and takes it for its own write, so
// both calls run fn: the partner is called twice by one run.
func TestStepOfOneNameCalledConcurrentlyRunsOnce(t *testing.T) {
	b, f, k, ctx := faultyRun(t, "one")
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
		// The second Step waits for the first, whose reply is held for the
		// delay (stop runs after both), so the delay is short: if the second
		// Step were slower than it, the test would pass, never fail falsely.
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

// checkpointWrite matches the update that records checkpoint name.
func checkpointWrite(coll, name string) mongotest.Match {
	return func(c *mongotest.Command) bool {
		return c.Collection == coll && c.Name == "update" && strings.Contains(commandText(c), `"c:`+name+`"`)
	}
}

// TestCheckpointOfOneNameRecordedConcurrentlyOnce: two goroutines of one run
// record one checkpoint name at once, the first's reply held while the
// second records: exactly one records it, the other gets ErrInvalid (the
// name is recorded), and the record holds the point once.
func TestCheckpointOfOneNameRecordedConcurrentlyOnce(t *testing.T) {
	b, f, k, ctx := faultyRun(t, "one")
	_, err := k.Do(ctx, "pay-9", nil, func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		// Short, as in TestStepOfOneNameCalledConcurrentlyRunsOnce.
		stop := f.DelayReplies(5*time.Second, checkpointWrite(b.coll.Name(), "reserved"))
		defer stop()
		var wg sync.WaitGroup
		var aErr error
		wg.Go(func() { aErr = c.Checkpoint(ctx, "reserved", []byte("a")) })
		require.Eventually(t, func() bool { return hasPoint(t, b, "pay-9", "c:reserved") }, time.Minute, 5*time.Millisecond)
		bErr := c.Checkpoint(ctx, "reserved", []byte("b"))
		wg.Wait()
		require.NoError(t, aErr, "the first recorded it")
		require.ErrorIs(t, bErr, idempotency.ErrInvalid, "the second found it recorded")
		data, ok := c.Reached("reserved")
		require.True(t, ok)
		require.Equal(t, []byte("a"), data)
		return idempotency.Result{Status: 200}, nil
	})
	require.NoError(t, err)
	n := 0
	for _, p := range load(t, b.coll, "pay-9").Points {
		if p.K == "c:reserved" {
			n++
		}
	}
	require.Equal(t, 1, n, "the checkpoint is on the record once")
}

// faultyRun is a key set of owner whose commands pass through a faulty
// proxy, the proxy, and a context that ends the test within 2 minutes.
func faultyRun(t *testing.T, owner string) (*bundle, *mongotest.Faulty, *idempotency.Keys, context.Context) {
	t.Helper()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return b, f, b.keys(t, f.Collection(b.coll.Name()), owner, nil), ctx
}

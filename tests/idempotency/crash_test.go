package idempotency_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
)

// partner is a fake partner API that dedupes on the idempotency key it is
// given, as Stripe does: a second call with a key gets the first answer
// and changes nothing.
type partner struct {
	mu      sync.Mutex
	calls   []string          // op + " " + key, in order
	applied map[string][]byte // key -> answer
	effects map[string]int    // op -> times applied
}

func newPartner() *partner {
	return &partner{applied: map[string][]byte{}, effects: map[string]int{}}
}

func (p *partner) call(op, key string) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, op+" "+key)
	if r, ok := p.applied[key]; ok {
		return r
	}
	p.effects[op]++
	r := fmt.Appendf(nil, "%s#%d", op, len(p.applied)+1)
	p.applied[key] = r
	return r
}

// TestCrashResumesAtCheckpoint: a request switches a user's primary identity
// at a partner in three steps (unlink, link, notify). Its process dies in
// the middle of the second: the partner has linked, the checkpoint is not
// written, the claim is never released (all its traffic stops). A retry,
// in another process, gets ErrInProgress until the dead claim expires, then
// runs as attempt 2: it skips unlink, calls link again with the same partner
// key (so the partner applies it once), runs notify, and stores the result,
// which later retries get.
func TestCrashResumesAtCheckpoint(t *testing.T) { eachMode(t, testCrashResumes) }

//nolint:thelper // the body of a test, run once per mode
func testCrashResumes(t *testing.T, mode lease.Mode) {
	// Long enough that the dying run's renewals keep its claim on a loaded
	// machine until it freezes: a claim lost before link ends the run early
	// (seen with 5 s on DocumentDB, two suites on two cores).
	const ttl = 12 * time.Second
	b := setup(t)
	f := b.db.Faulty(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dying := b.keys(t, f.Collection(b.coll.Name()), "dying", &idempotency.Options{TTL: ttl, Mode: mode, Clock: b.clock})
	survivor := b.keys(t, nil, "survivor", &idempotency.Options{TTL: ttl, Mode: mode})
	p := newPartner()

	step := func(ctx context.Context, c *idempotency.Call, op string, die bool) error {
		_, err := c.Step(ctx, op, func(ctx context.Context, key string) ([]byte, error) {
			r := p.call(op, key)
			if die {
				// The process freezes here, after the partner acted and
				// before the checkpoint: none of its traffic gets through
				// any more (renewals, the release), so its claim expires.
				f.Pause(time.Hour)
				<-ctx.Done()
				return nil, context.Cause(ctx)
			}
			return r, nil
		})
		return err
	}
	flow := func(dieAt string) idempotency.Func {
		return func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
			for _, op := range []string{"unlink", "link", "notify"} {
				if err := step(ctx, c, op, op == dieAt); err != nil {
					return idempotency.Result{}, err
				}
			}
			return idempotency.Result{Status: 200, Body: fmt.Appendf(nil, "switched by attempt %d", c.Attempt())}, nil
		}
	}

	var (
		wg       sync.WaitGroup
		dyingErr error
	)
	dyingDone := make(chan struct{})
	wg.Go(func() {
		defer close(dyingDone)
		_, dyingErr = dying.Do(ctx, "switch-42", []byte("to identity B"), flow("link"))
	})
	// Wait until the dying run is frozen, then retry as a client would.
	frozen := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.calls) == 2
	}
	require.Eventually(t, func() bool {
		select {
		case <-dyingDone:
			return true
		default:
			return frozen()
		}
	}, time.Minute, 5*time.Millisecond, "the dying run never reached link")
	if !frozen() {
		<-dyingDone
		t.Fatalf("the dying run ended before it froze in link: %v", dyingErr)
	}

	var resumedAt string
	attempts := 0
	res, err := doUntilDone(ctx, t, survivor, "switch-42", []byte("to identity B"),
		func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
			attempts++
			resumedAt = c.Last()
			require.Equal(t, 2, c.Attempt())
			return flow("")(ctx, c)
		})
	require.NoError(t, err)
	require.Equal(t, 1, attempts)
	require.Equal(t, "unlink", resumedAt, "resumed after the last checkpoint")
	require.Equal(t, "switched by attempt 2", string(res.Body))
	wg.Wait()
	require.ErrorIs(t, dyingErr, idempotency.ErrLost, "the frozen run lost its claim")

	p.mu.Lock()
	require.Len(t, p.calls, 4, "unlink, link, link again, notify: %v", p.calls)
	require.Equal(t, p.calls[1], p.calls[2], "the resumed link carried the same partner key")
	require.Equal(t, map[string]int{"unlink": 1, "link": 1, "notify": 1}, p.effects, "each effect once")
	p.mu.Unlock()

	rec := load(t, b.coll, "switch-42")
	require.Equal(t, 2, rec.Attempts)
	ks := make([]string, 0, len(rec.Points))
	for _, pt := range rec.Points {
		ks = append(ks, pt.K)
	}
	require.Equal(t, []string{"b:unlink", "c:unlink", "b:link", "c:link", "b:notify", "c:notify"}, ks)
	require.Less(t, rec.Points[2].E, rec.Points[3].E, "link began under the dead claim, finished under the next")

	again, err := survivor.Do(ctx, "switch-42", []byte("to identity B"), flow(""))
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, res.Body, again.Body)
}

// TestStaleCheckpointFails: a checkpoint write of a claim that was taken
// over changes nothing, even when it reaches the server late, with a fence
// computed while the claim held. The write is held at the proxy (the client
// gets a network error and cannot settle it: its re-read fails too), the
// next claim runs, and then the held copy is delivered: it matches nothing.
func TestStaleCheckpointFails(t *testing.T) { eachMode(t, testStaleCheckpoint) }

//nolint:thelper // the body of a test, run once per mode
func testStaleCheckpoint(t *testing.T, mode lease.Mode) {
	b := setup(t)
	f := b.db.Faulty(t, nil)
	ctx := context.Background()
	stale := b.keys(t, f.Collection(b.coll.Name()), "stale", &idempotency.Options{TTL: time.Minute, Mode: mode, Clock: b.clock})
	next := b.keys(t, nil, "next", &idempotency.Options{TTL: time.Minute, Mode: mode})

	var held, unread *mongotest.Fault
	_, err := stale.Do(ctx, "k", nil, func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		held = f.HoldNext(writeOf(b.coll.Name(), "checkpoint"))
		unread = f.ErrorBeforeApply(mongotest.Commands([]string{"find"}, b.coll.Name()), mongotest.ServerError{Code: 6, CodeName: "HostUnreachable"})
		return idempotency.Result{}, c.Checkpoint(ctx, "paid", []byte("stale"))
	})
	require.True(t, held.HasFired())
	require.True(t, unread.HasFired())
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome, "the checkpoint could not be settled")
	var unknown *idempotency.UnknownOutcomeError
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, `checkpoint "paid"`, unknown.Op)

	res, err := next.Do(ctx, "k", nil, func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		require.Equal(t, 2, c.Attempt())
		_, reached := c.Reached("paid")
		require.False(t, reached)
		// The stale copy arrives now, while this claim holds the key.
		reply, err := held.Deliver(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 0, reply.Lookup("n").AsInt64(), "the stale checkpoint matched nothing: %v", reply)
		if err := c.Checkpoint(ctx, "paid", []byte("next")); err != nil {
			return idempotency.Result{}, err
		}
		return idempotency.Result{Status: 200}, nil
	})
	require.NoError(t, err)
	require.False(t, res.Replayed)
	rec := load(t, b.coll, "k")
	require.Len(t, rec.Points, 1)
	require.Equal(t, []byte("next"), rec.Points[0].D)
	require.Equal(t, rec.Epoch, rec.Points[0].E)
}

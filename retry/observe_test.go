package retry_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
)

// events records the events it observes, with the context value under
// ctxKey.
type events struct {
	mu  sync.Mutex
	got []observe.Event
	ctx []any
}

type ctxKey struct{}

func (r *events) Start(ctx context.Context, e observe.Event) context.Context {
	r.Observe(ctx, e)
	return ctx
}

func (r *events) Observe(ctx context.Context, e observe.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, e)
	r.ctx = append(r.ctx, ctx.Value(ctxKey{}))
}

// TestDoObserver: each retry is one Retry event, with the attempt that
// failed, its delay and its cause, after OnRetry; a refusal by the budget
// is one BudgetRefused event; all with Do's context.
func TestDoObserver(t *testing.T) {
	t.Parallel()
	var rec events
	var order []string
	clock := newFakeClock()
	p := retry.Policy{
		Jitter: retry.NoJitter, InitialInterval: time.Millisecond, MaxInterval: time.Second,
		Budget:  retry.NewBudget(0, 2),
		OnRetry: func(retry.Attempt) { order = append(order, "OnRetry") },
		Observer: observerFunc(func(ctx context.Context, e observe.Event) {
			order = append(order, e.Kind.String())
			rec.Observe(ctx, e)
		}),
		Clock: clock,
	}
	fn, calls := counter(errConflict)
	ctx := context.WithValue(t.Context(), ctxKey{}, "op")
	err := retry.Do(ctx, p, fn)
	require.ErrorIs(t, err, retry.ErrBudgetExhausted)
	require.Equal(t, 3, calls())
	require.Equal(t, []observe.Event{
		{Kind: observe.Retry, Attempt: 1, Delay: time.Millisecond, Err: errConflict},
		{Kind: observe.Retry, Attempt: 2, Delay: 2 * time.Millisecond, Err: errConflict},
		{Kind: observe.BudgetRefused, Attempt: 3, Err: errConflict},
	}, rec.got)
	require.Equal(t, []any{"op", "op", "op"}, rec.ctx)
	require.Equal(t, []string{"OnRetry", "retry", "OnRetry", "retry", "retry.budget_refused"}, order)
}

type observerFunc func(context.Context, observe.Event)

func (f observerFunc) Start(ctx context.Context, e observe.Event) context.Context {
	f(ctx, e)
	return ctx
}
func (f observerFunc) Observe(ctx context.Context, e observe.Event) { f(ctx, e) }

// TestDoObserverFirstTryAllocatesNothing: an Observer costs nothing when
// the first attempt succeeds.
func TestDoObserverFirstTryAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	p := retry.Policy{Observer: &observe.Counters{}}
	ok := func(context.Context) error { return nil }
	require.Zero(t, testing.AllocsPerRun(200, func() { _ = retry.Do(ctx, p, ok) }))
}

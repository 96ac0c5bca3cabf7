package idempotency

import (
	"context"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/observe"
)

// report sends the Observer, if there is one, the event of kind about ref's
// key, with the facts set adds. Keys report one at each point where a
// request's fate is known; the claim's own events come from the lease
// Manager, which reports to the same Observer.
func (k *Keys) report(ctx context.Context, kind observe.Kind, ref keyRef, set func(*observe.Event)) {
	if k.c.observer == nil {
		return
	}
	e := observe.Event{Kind: kind, Op: "do", Database: k.coll.Database().Name(), Collection: k.coll.Name(), ID: ref.key}
	if set != nil {
		set(&e)
	}
	k.c.observer.Observe(ctx, e)
}

// settling is the engine's configuration for a write of ref's key (op):
// its re-reads, and the Ambiguous and Settled events every package reports
// alike, when there is an Observer.
func (k *Keys) settling(ctx context.Context, op string, ref keyRef) settle.Config {
	c := k.c.settling()
	if k.c.observer != nil {
		c.Ambiguous = func(err error) {
			k.report(ctx, observe.Ambiguous, ref, func(e *observe.Event) { e.Op, e.Err = op, err })
		}
		c.Settled = func(s observe.Settlement, err error) {
			k.report(ctx, observe.Settled, ref, func(e *observe.Event) { e.Op, e.Settlement, e.Err = op, s, err })
		}
	}
	return c
}

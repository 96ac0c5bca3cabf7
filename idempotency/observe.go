package idempotency

import (
	"context"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/observe"
)

// The events of Keys (see Options.Observer). Every function here checks for
// an Observer before it builds anything, so that Keys without one cost
// nothing more than before. Keys.Do and the HTTP middleware report them
// through do and run, one line at each point where a request's fate is
// known; the claim's own events (op.start do, lease.acquired, ...) come
// from the lease Manager, which reports to the same Observer.

// opDo is the Op of the Keys' events.
const opDo = "do"

// event returns an event of kind k about the key of ref.
func (k *Keys) event(kind observe.Kind, ref keyRef) observe.Event {
	return observe.Event{Kind: kind, Op: opDo, Database: k.coll.Database().Name(), Collection: k.coll.Name(), ID: ref.key}
}

// report reports an event of kind k (KeyReplayed, KeyMismatch) about the
// key of ref.
func (k *Keys) report(ctx context.Context, kind observe.Kind, ref keyRef) {
	if k.c.observer != nil {
		k.c.observer.Observe(ctx, k.event(kind, ref))
	}
}

// settling is the engine's configuration for a write of ref's key (op):
// its re-reads, and the Ambiguous and Settled events every package reports
// alike, when there is an Observer.
func (k *Keys) settling(ctx context.Context, op string, ref keyRef) settle.Config {
	c := k.c.settling()
	if k.c.observer == nil {
		return c
	}
	c.Ambiguous = func(err error) {
		e := k.event(observe.Ambiguous, ref)
		e.Op, e.Err = op, err
		k.c.observer.Observe(ctx, e)
	}
	c.Settled = func(s observe.Settlement, err error) {
		e := k.event(observe.Settled, ref)
		e.Op, e.Settlement, e.Err = op, s, err
		k.c.observer.Observe(ctx, e)
	}
	return c
}

// completed reports that the run attempt of ref's key, under the claim of
// epoch, stored its result.
func (k *Keys) completed(ctx context.Context, ref keyRef, attempt int, epoch int64) {
	if k.c.observer == nil {
		return
	}
	e := k.event(observe.KeyCompleted, ref)
	e.Attempt, e.Epoch = attempt, epoch
	k.c.observer.Observe(ctx, e)
}

// inProgress reports that another request holds ref's key: held says
// whose claim, and for how long at most.
func (k *Keys) inProgress(ctx context.Context, ref keyRef, held *lease.HeldError) {
	if k.c.observer == nil {
		return
	}
	e := k.event(observe.KeyInProgress, ref)
	e.Holder, e.Epoch, e.TimeLeft = held.Owner, held.Epoch, held.TimeLeft
	k.c.observer.Observe(ctx, e)
}

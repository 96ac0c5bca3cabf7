package lease

import (
	"context"
	"errors"
	"time"

	"github.com/mongocas/mongocas/internal/ended"
	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/observe"
)

// The operations a Manager reports, as observe.Event.Op. Every function
// here checks for an Observer before it builds anything.
const (
	opAcquire    = "acquire"
	opTryAcquire = "try_acquire"
	opDo         = "do"
	opRenew      = "renew"
	opRelease    = "release"
)

// observed is one operation in progress: zero without an Observer.
type observed struct {
	ctx     context.Context // the context Observer.Start returned
	op      string
	id      any
	start   time.Time // Options.Now
	aborted bool      // Do's fn returned an error
}

// begin reports the start of op on id, and returns the Observer's context.
func (m *Manager) begin(ctx context.Context, op string, id any) (context.Context, observed) {
	o := m.c.Observer
	if o == nil {
		return ctx, observed{}
	}
	ctx = o.Start(ctx, m.event(observe.OpStart, op, id))
	return ctx, observed{ctx: ctx, op: op, id: id, start: m.c.Now()}
}

// end reports the end of the operation begin started, with its error.
func (m *Manager) end(ob *observed, err *error) {
	if ob.ctx == nil {
		return
	}
	e := m.event(observe.OpEnd, ob.op, ob.id)
	e.Err, e.Outcome, e.Elapsed = *err, ended.Outcome(*err, outcomes...), m.c.Now().Sub(ob.start)
	if ob.aborted && *err != nil && e.Outcome != observe.OutcomeLost {
		e.Outcome = observe.OutcomeAborted
	}
	m.c.Observer.Observe(ob.ctx, e)
}

func (m *Manager) event(k observe.Kind, op string, id any) observe.Event {
	return observe.Event{Kind: k, Op: op, Database: m.coll.Database().Name(), Collection: m.coll.Name(), ID: id, Owner: m.c.Owner}
}

// acquired reports l, if not nil, claimed by the call that began at start.
func (m *Manager) acquired(ctx context.Context, op string, l *Lease, start time.Time) {
	if m.c.Observer == nil || l == nil {
		return
	}
	e := m.event(observe.LeaseAcquired, op, l.id)
	e.Epoch, e.Wait = l.epoch, m.c.Now().Sub(start)
	m.c.Observer.Observe(ctx, e)
}

// heldBy reports a claim that found the lease held by r for up to left.
func (m *Manager) heldBy(ctx context.Context, id any, r record, left time.Duration) {
	if m.c.Observer == nil {
		return
	}
	e := m.event(observe.LeaseHeld, opAcquire, id)
	e.Holder, e.Epoch, e.TimeLeft = r.Owner, r.Epoch, left
	m.c.Observer.Observe(ctx, e)
}

// settling is the settling engine's Config for a write of op on id, with
// the observe.Ambiguous and observe.Settled events.
func (m *Manager) settling(ctx context.Context, op string, id any) settle.Config {
	c := settle.Config{Retry: m.readPolicy(), ResolveTimeout: m.c.ResolveTimeout}
	if o := m.c.Observer; o != nil {
		report := func(k observe.Kind, how observe.Settlement, err error) {
			e := m.event(k, op, id)
			e.Settlement, e.Err = how, err
			o.Observe(ctx, e)
		}
		c.Ambiguous = func(cause error) { report(observe.Ambiguous, 0, cause) }
		c.Settled = func(how observe.Settlement, why error) { report(observe.Settled, how, why) }
	}
	return c
}

// endRenew reports Renew renewed, or failed without losing the lease (finish
// reports a loss), then the operation's end.
func (l *Lease) endRenew(ob *observed, err *error) {
	m := l.m
	if ob.ctx == nil {
		return
	}
	e := m.event(observe.LeaseRenewed, opRenew, l.id)
	e.Epoch = l.epoch
	switch {
	case *err == nil:
		e.TimeLeft = l.TimeLeft()
		m.c.Observer.Observe(ob.ctx, e)
	case !errors.Is(*err, ErrLost) && !errors.Is(*err, ErrReleased):
		e.Kind, e.Err = observe.LeaseRenewFailed, *err
		m.c.Observer.Observe(ob.ctx, e)
	}
	m.end(ob, err)
}

// ended reports the end of l: released (ErrReleased) or lost.
func (l *Lease) ended(err error) {
	m := l.m
	if m.c.Observer == nil {
		return
	}
	e := m.event(observe.LeaseReleased, opRelease, l.id)
	e.Epoch, e.Held = l.epoch, m.c.Now().Sub(l.sentAt)
	if errors.Is(err, ErrReleased) {
		m.c.Observer.Observe(l.ctx, e)
		return
	}
	var lost *LostError // here, not above: errors.As moves it to the heap
	if errors.As(err, &lost) {
		e.Kind, e.Op, e.Err, e.Holder, e.Reason = observe.LeaseLost, "", err, lost.Holder, reasons[lost.Reason][1]
		m.c.Observer.Observe(l.ctx, e)
	}
}

// outcomes are the Manager's own errors, in the order ended.Outcome tries
// them: a lost lease wins over the context's end it caused in Do's fn.
var outcomes = []ended.Rule{
	{Err: ErrLost, Outcome: observe.OutcomeLost},
	{Err: ErrReleased, Outcome: observe.OutcomeLost},
	{Err: ErrHeld, Outcome: observe.OutcomeHeld},
	{Err: ErrNotFound, Outcome: observe.OutcomeNotFound},
}

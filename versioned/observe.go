package versioned

import (
	"context"
	"errors"
	"time"

	"github.com/mongocas/mongocas/internal/ended"
	"github.com/mongocas/mongocas/observe"
)

// The repository's events (see Options.Observer). Every function here
// checks for an Observer before it builds anything.

// observed is one operation in progress: zero when the repository has no
// Observer.
type observed struct {
	ctx      context.Context // the context Observer.Start returned
	op       string
	id       any
	start    time.Time
	attempts int  // Modify's reads
	aborted  bool // Modify's fn returned an error
}

// begin reports the start of operation op on id to the Observer, and
// returns the context it gives the operation (ctx itself without one).
func (r *Repo[T]) begin(ctx context.Context, op string, id any) (context.Context, observed) {
	o := r.opts.Observer
	if o == nil {
		return ctx, observed{}
	}
	ctx = o.Start(ctx, r.event(observe.OpStart, op, id))
	return ctx, observed{ctx: ctx, op: op, id: id, start: time.Now()}
}

// end reports the end of the operation begin started, with its error.
func (r *Repo[T]) end(ob *observed, err *error) {
	if ob.ctx == nil {
		return
	}
	e := r.event(observe.OpEnd, ob.op, ob.id)
	e.Err, e.Outcome, e.Elapsed, e.Attempt = *err, outcomeOf(*err), time.Since(ob.start), ob.attempts
	if ob.aborted && *err != nil {
		e.Outcome = observe.OutcomeAborted
	}
	r.opts.Observer.Observe(ob.ctx, e)
}

func (r *Repo[T]) event(k observe.Kind, op string, id any) observe.Event {
	return observe.Event{Kind: k, Op: op, Database: r.coll.Database().Name(), Collection: r.coll.Name(), ID: id}
}

// conflicted reports err to the Observer if it is a *ConflictError, and
// returns it.
func (r *Repo[T]) conflicted(ctx context.Context, err error) error {
	if r.opts.Observer == nil {
		return err // before ce, which errors.As would move to the heap
	}
	var ce *ConflictError
	if errors.As(err, &ce) {
		e := r.event(observe.Conflict, ce.Op, ce.ID)
		e.Expected, e.Current = ce.Expected, ce.Current
		r.opts.Observer.Observe(ctx, e)
	}
	return err
}

// settling reports an event of settling write w (Ambiguous, with its
// error; Settled, with how, and the error when unknown) to the Observer: in
// ctx, or in the context of each call whose change w carries.
func (r *Repo[T]) settling(ctx context.Context, w *write, k observe.Kind, s observe.Settlement, err error) {
	if r.opts.Observer == nil {
		return
	}
	e := r.event(k, w.op, w.id)
	e.Settlement = s
	if k == observe.Ambiguous || s == observe.SettledUnknown {
		e.Err = err
	}
	if w.to == nil {
		r.opts.Observer.Observe(ctx, e)
		return
	}
	for _, c := range w.to {
		r.opts.Observer.Observe(c, e)
	}
}

// outcomes are the repository's own errors, in the order ended.Outcome tries
// them.
var outcomes = []ended.Rule{
	{Err: ErrConflict, Outcome: observe.OutcomeConflict},
	{Err: ErrNotFound, Outcome: observe.OutcomeNotFound},
	{Err: ErrGuardFailed, Outcome: observe.OutcomeGuardFailed},
	{Err: ErrDuplicate, Outcome: observe.OutcomeDuplicate},
}

// outcomeOf names how an operation that returned err ended.
func outcomeOf(err error) observe.Outcome { return ended.Outcome(err, outcomes...) }

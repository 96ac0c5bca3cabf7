package versioned

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// Modify reads the document with the given id, calls fn on a fresh copy of
// it, and writes fn's changes back if the document has not changed since it
// was read: one find and one updateOne filtered on the id and the version
// read, that $sets the changed mapped fields, $unsets the removed ones and
// raises the version. It returns the document as stored. If fn changes
// nothing, nothing is written and the document as read is returned. Where
// the server runs update pipelines (MongoDB, DocumentDB) the write is a
// findOneAndUpdate filtered on the id whose pipeline applies the same change
// only if the version is still the one read, and which returns the current
// document when it is not: a conflict then costs one round trip, since the
// retry starts from that document instead of reading again.
//
// Calls on one document in one process wait in line instead of racing each
// other through the server (every Repo on the same collection of the same
// *mongo.Client shares the line). The call at the head of the line reads
// once for itself and the calls behind it from the same Repo (up to 16),
// calls each fn in turn, each on a fresh copy of the state the fn before it
// left (fn's changes, or the state as read), and writes all their changes in
// one updateOne. Each call gets a version of its own, one above the state
// its fn saw (a combined write of k changes raises the version by k), its
// own write id, and the document as its fn left it. An fn that returns an
// error, or changes nothing, adds nothing to the write; the next fn sees the
// state it was given. A call whose fn saw a state another fn of the write
// left succeeds, or fails with fn's error, only if that write lands:
// otherwise its fn runs again on the state read next. Calls with a Where
// filter or WithRetry, or whose ctx carries a session, take their turn in
// line alone. fn may run on the goroutine of another call in the line; if it
// panics, the panic is raised again on its own call's goroutine, and nothing
// of it is written.
//
// On a conflict (another process wrote the document in between) Modify
// reads again and calls fn again on the new state, with jittered backoff,
// under the repository's retry policy (Options.Retry, or WithRetry for this
// call): by default it keeps retrying for up to 10 seconds, within the
// repository's retry budget. So fn may run several times, each time on a
// freshly read copy; it must not have side effects that cannot be repeated.
// When the retries run out the error matches ErrConflict and
// retry.ErrExhausted (or retry.ErrBudgetExhausted).
//
// An error from fn aborts Modify without a write; Modify returns it wrapped,
// so errors.Is and errors.As reach it. fn must not change the id
// (*InvalidError); changes it makes to the version field are ignored.
//
// With Where filters, the document must match them when read (otherwise fn
// is not called and Modify returns a *GuardError) and when written.
//
// Inside a transaction (ctx carries a session with a transaction in
// progress) Modify makes one attempt, outside the line, and returns a
// *ConflictError as it is, for the transaction's own retry loop to handle.
func (r *Repo[T]) Modify(ctx context.Context, id any, fn func(doc *T) error, opts ...WriteOption) (*T, error) {
	const op = "modify"
	idv, key, err := r.start(ctx, op, id)
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, &InvalidError{Op: op, Reason: "fn is nil"}
	}
	cfg := newWriteConfig(opts)
	m := &member[T]{ctx: ctx, fn: fn}
	if inTransaction(ctx) {
		b := batch[T]{r: r, op: op, id: idv, key: key, cfg: &cfg, lead: m, ms: []*member[T]{m}}
		b.run(true)
		if m.panicked != nil {
			panic(m.panicked.value)
		}
		return m.out, m.err2
	}
	var class any = r
	if len(cfg.guards) > 0 || cfg.policy != nil || mongo.SessionFromContext(ctx) != nil {
		class = nil // alone: its own filters, policy or session
	}
	m.w = newWaiter(class, m)
	return r.inLine(ctx, op, idv, key, &cfg, m)
}

// member is one Modify call in a batch.
type member[T any] struct {
	w   *waiter // nil outside a line
	ctx context.Context
	fn  func(doc *T) error

	// The current attempt.
	res      *T       // the document as fn left it (or as fn saw it, if unchanged)
	wid      string   // the write id of its change ("" for none)
	base     int64    // the version its change was made against
	fnErr    error    // fn's error
	panicked *fnPanic // fn panicked
	err      error    // why its change cannot be written (*InvalidError)
	real     bool     // fn saw the state as read, not one another fn left
	deferred bool     // left for the next batch

	// The outcome, once settled.
	done bool
	out  *T
	err2 error
}

// changedNothing reports whether the member's fn left nothing to write.
func (m *member[T]) changedNothing() bool { return m.wid == "" }

// inLine waits for m's turn on the document, leads a batch when promoted,
// and returns m's outcome.
func (r *Repo[T]) inLine(ctx context.Context, op string, id any, key bson.RawValue, cfg *writeConfig, m *member[T]) (*T, error) {
	dk := cacheKey(key)
	q := r.lines
	q.enqueue(dk, m.w)
	for {
		switch q.state(m.w) {
		case wDone:
			if m.panicked != nil {
				panic(m.panicked.value) // fn's panic, on its caller's goroutine
			}
			return m.out, m.err2
		case wLeading:
			r.lead(op, id, key, cfg, dk, m)
			continue
		default:
		}
		select {
		case <-m.w.wake:
		case <-ctx.Done():
			if q.withdraw(dk, m.w) {
				return nil, wrapErr(op, id, store.ContextError(ctx))
			}
			<-m.w.wake // its change is in flight, or it was settled: wait for that
		}
	}
}

// lead forms the batch m leads, runs it, and hands the line on.
func (r *Repo[T]) lead(op string, id any, key bson.RawValue, cfg *writeConfig, dk string, m *member[T]) {
	ws := r.lines.take(dk, m.w, maxBatch)
	ms := make([]*member[T], len(ws))
	for i, w := range ws {
		ms[i] = w.self.(*member[T]) //nolint:forcetypeassert // a class is one Repo[T]; m itself otherwise
	}
	b := batch[T]{r: r, op: op, id: id, key: key, cfg: cfg, lead: m, ms: ms, lines: r.lines}
	ended := false
	defer func() {
		if ended {
			return
		}
		// The leader's goroutine is unwinding (a panic outside fn, or
		// runtime.Goexit in fn): settle the others and hand the line on.
		for _, x := range append([]*member[T](nil), b.ms...) {
			if x != m {
				b.settle(x, nil, wrapErr(op, id, errLeaderGone))
			}
		}
		r.lines.release(dk, nil)
	}()
	rest := b.run(false)
	ended = true
	r.lines.release(dk, rest)
}

// errLeaderGone is the error of calls whose batch ended because the
// goroutine running it stopped (runtime.Goexit in an fn, or a panic).
var errLeaderGone = errors.New("the call leading the combined write stopped")

// fnPanic holds the value an fn panicked with, to panic again on its
// caller's goroutine.
type fnPanic struct{ value any }

// call calls fn on doc, catching a panic.
func call[T any](fn func(*T) error, doc *T) (p *fnPanic, err error) {
	defer func() {
		if v := recover(); v != nil {
			p = &fnPanic{value: v}
		}
	}()
	return nil, fn(doc)
}

// batch is the Modify calls one write combines.
type batch[T any] struct {
	r     *Repo[T]
	op    string
	id    any
	key   bson.RawValue
	cfg   *writeConfig
	lead  *member[T]   // the call whose goroutine runs the batch
	ms    []*member[T] // the calls not settled yet, in line order
	lines *collLines   // nil outside a line (in a transaction)
	io    context.Context
	pre   *docState // the current document, as a failed CAS write returned it
}

// errBatchEmpty ends a batch whose calls have all been settled or left.
var errBatchEmpty = errors.New("versioned: batch empty")

// run runs the batch under the policy (one attempt if once) and settles its
// calls. It returns the waiters of the calls it did not settle, for the
// line: calls left for a later batch, or, when the leader's context ended,
// the other calls.
func (b *batch[T]) run(once bool) []*waiter {
	r := b.r
	b.io = b.lead.ctx
	if len(b.ms) > 1 {
		var cancel context.CancelFunc
		b.io, cancel = b.sharedContext()
		defer cancel()
	}
	var err error
	if once {
		err = b.attempt()
	} else {
		p := *r.policy(b.cfg)
		if b.lines != nil {
			user := p.OnRetry
			p.OnRetry = func(a retry.Attempt) {
				b.idle()
				if user != nil {
					user(a)
				}
			}
		}
		err = retry.Do(b.lead.ctx, p, func(context.Context) error { return b.attempt() })
	}
	b.idle()
	switch {
	case err == nil, errors.Is(err, errBatchEmpty):
		// Settled in the attempt; what is left was deferred.
	case b.lines != nil && b.lead.ctx.Err() != nil && stopped(err):
		// The leader's context ended: it returns, the others go back in line.
		b.settle(b.lead, nil, wrapErr(b.op, b.id, err))
	default:
		err = b.final(err)
		for _, m := range b.ms {
			b.settle(m, nil, b.errFor(err, m))
		}
	}
	var rest []*waiter
	for _, m := range b.ms {
		if m.w != nil && !m.done {
			rest = append(rest, m.w)
		}
	}
	return rest
}

// stopped reports whether a retry loop ended by its context.
func stopped(err error) bool {
	return !errors.Is(err, ErrUnknownOutcome) &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// sharedContext returns the context of a batch's reads and writes: the
// leader's values, ended when every call's context has ended. A caller
// whose context ends leaves the batch between attempts; the write is not
// cut short for the others.
func (b *batch[T]) sharedContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(b.lead.ctx))
	live := atomic.Int64{}
	live.Store(int64(len(b.ms)))
	stops := make([]func() bool, len(b.ms))
	for i, m := range b.ms {
		stops[i] = context.AfterFunc(m.ctx, func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// busy marks the batch's calls in progress (they cannot leave) and drops
// those that left since the last attempt.
func (b *batch[T]) busy() {
	if b.lines == nil {
		return
	}
	keep := b.lines.busy(waitersOf(b.ms))
	ms := b.ms[:0]
	for _, m := range b.ms {
		if len(keep) > 0 && keep[0] == m.w {
			ms = append(ms, m)
			keep = keep[1:]
		}
	}
	b.ms = ms
}

// idle marks the batch's calls as between attempts: a call whose context
// ends may leave.
func (b *batch[T]) idle() {
	if b.lines != nil {
		b.lines.idle(waitersOf(b.ms))
	}
}

func waitersOf[T any](ms []*member[T]) []*waiter {
	ws := make([]*waiter, 0, len(ms))
	for _, m := range ms {
		ws = append(ws, m.w)
	}
	return ws
}

// settle gives m its outcome and takes it out of the batch.
func (b *batch[T]) settle(m *member[T], out *T, err error) {
	m.out, m.err2, m.done = out, err, true
	if m.w != nil {
		b.lines.settle(m.w)
	}
	for i, x := range b.ms {
		if x == m {
			b.ms = append(b.ms[:i], b.ms[i+1:]...)
			break
		}
	}
}

// settleOwn settles m with its own result: the document its fn left, fn's
// error, or why its change could not be written.
func (b *batch[T]) settleOwn(m *member[T]) {
	switch {
	case m.panicked != nil:
		b.settle(m, nil, nil)
	case m.fnErr != nil:
		b.settle(m, nil, fmt.Errorf("versioned: %s %v: fn: %w", b.op, b.id, m.fnErr))
	case m.err != nil:
		b.settle(m, nil, m.err)
	default:
		b.settle(m, m.res, nil)
	}
}

// attempt is one read, the calls' fns, and one write. It returns nil when
// the batch is settled, and otherwise the error of the attempt, which is
// every unsettled call's unless the retry loop tries again.
func (b *batch[T]) attempt() error {
	r, op, id := b.r, b.op, b.id
	b.busy()
	if len(b.ms) == 0 {
		return retry.Permanent(errBatchEmpty)
	}
	st := b.pre
	b.pre = nil
	if st == nil {
		var err error
		if st, err = b.read(); err != nil {
			return err
		}
	}
	if err := checkBase(op, r.opts.VersionField, st.version, true); err != nil {
		return err
	}
	before, err := r.decode(op, id, st)
	if err != nil {
		return err
	}
	k, last, raw := b.apply(st, before)
	// A call whose fn saw the state as read and wrote nothing is settled:
	// its outcome does not depend on the write.
	for _, m := range append([]*member[T](nil), b.ms...) {
		if m.real && m.changedNothing() && !m.deferred {
			b.settleOwn(m)
		}
	}
	if k == 0 {
		return nil
	}
	set, unset := r.diff(valueOf(before), valueOf(last.res), raw)
	if _, err := st.raw.LookupErr(r.opts.MetaField, metaOldW); err == nil {
		// Write ids of the protocol before this one: nobody reads them.
		unset = append(unset, bson.E{Key: r.opts.MetaField + "." + metaOldW, Value: ""})
	}
	wids := make([]string, 0, k)
	for _, m := range b.ms {
		if m.wid != "" {
			wids = append(wids, m.wid)
		}
	}
	base := st.version
	out, err := r.casBatch(b.io, op, id, b.key, st, set, unset, wids, b.cfg)
	switch {
	case err != nil:
		return err
	case out.landed:
		for _, m := range append([]*member[T](nil), b.ms...) {
			if !m.deferred {
				b.settleOwn(m)
			}
		}
		return nil
	case out.current != nil:
		// The write returned the document it found: the next attempt
		// starts from it, with no read.
		b.pre = out.current
		if !inTransaction(b.io) {
			return &ConflictError{Op: op, ID: id, Expected: base, Current: out.current.version}
		}
		return r.classify(b.io, op, id, b.key, base, out.current, b.cfg.guards)
	case !out.read && !inTransaction(b.io):
		// The next attempt's read, after the backoff, tells whether the
		// document moved, went away or fails the filters: no re-read
		// now, which saves a round trip per conflict.
		return &ConflictError{Op: op, ID: id, Expected: base, Current: -1}
	}
	return r.notApplied(b.io, op, id, b.key, base, out.outcome, b.cfg.guards)
}

// read reads the document for an attempt; with Where filters, it tells a
// failed filter from a missing document.
func (b *batch[T]) read() (*docState, error) {
	r, op, id, key, guards := b.r, b.op, b.id, b.key, b.cfg.guards
	st, err := r.find(b.io, op, id, key, guards)
	if errors.Is(err, ErrNotFound) && len(guards) > 0 {
		// The guarded read missed: tell a failed guard from a missing
		// document. A failed re-read says neither.
		st, err := r.rereadNow(b.io, op, id, key)
		if err != nil {
			return nil, err
		}
		if st != nil {
			return nil, r.guardError(b.io, op, id, key, st.version, guards)
		}
		return nil, r.classify(b.io, op, id, key, 0, nil, nil)
	}
	return st, err
}

// apply calls each member's fn in turn, each on a fresh copy of the state
// the one before left, and returns how many changed the document, the last
// that did, and its encoding.
func (b *batch[T]) apply(st *docState, before *T) (k int, last *member[T], raw bson.Raw) {
	r, op, id := b.r, b.op, b.id
	cur, ver := valueOf(before), st.version
	for _, m := range b.ms {
		m.res, m.wid, m.base, m.fnErr, m.err, m.panicked, m.deferred = nil, "", 0, nil, nil, nil, false
		m.real = k == 0
		if ver == lastVersion {
			m.deferred = true // the next batch reads the document and refuses it
			continue
		}
		var doc *T
		var err error
		if k == 0 {
			doc, err = r.decode(op, id, st)
		} else {
			doc, err = r.decodeRaw(op, id, raw, ver)
		}
		if err != nil {
			m.err = err
			continue
		}
		p, err := call(m.fn, doc)
		if p != nil {
			m.panicked = p
			continue
		}
		if err != nil {
			m.fnErr = err
			continue
		}
		r.s.setVersion(valueOf(doc), ver)
		changed, err := r.changed(op, id, cur, valueOf(doc))
		if err != nil {
			m.err = err
			continue
		}
		m.res = doc
		if !changed {
			continue
		}
		enc, err := r.encode(op, doc)
		if err != nil {
			m.res, m.err = nil, err
			continue
		}
		m.wid, m.base = newWriteID(), ver
		ver++
		r.s.setVersion(valueOf(doc), ver)
		cur, raw, last = valueOf(doc), enc, m
		k++
	}
	return k, last, raw
}

// final completes the error that ends a batch: a conflict not yet re-read
// is re-read once, to report the current version, or why the write did not
// match; a stop by the policy or the context is wrapped.
func (b *batch[T]) final(err error) error {
	r, op, id := b.r, b.op, b.id
	var ce *ConflictError
	if errors.As(err, &ce) && ce.Current < 0 && b.lead.ctx.Err() == nil {
		st, rerr := r.rereadNow(b.lead.ctx, op, id, b.key)
		if rerr == nil {
			cerr := r.classify(b.lead.ctx, op, id, b.key, ce.Expected, st, b.cfg.guards)
			var c *ConflictError
			if !errors.As(cerr, &c) {
				return cerr
			}
			ce.Current = c.Current
		}
	}
	if errors.Is(err, retry.ErrExhausted) || errors.Is(err, retry.ErrBudgetExhausted) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if !errors.Is(err, ErrUnknownOutcome) {
			return wrapErr(op, id, err)
		}
	}
	return err
}

// errFor is the batch's final error as member m sees it: an unknown outcome
// names m's own write id and base version.
func (b *batch[T]) errFor(err error, m *member[T]) error {
	var ue *UnknownOutcomeError
	if m.wid != "" && errors.As(err, &ue) && ue.WriteID != m.wid {
		c := *ue
		c.WriteID, c.Base = m.wid, m.base
		return &c
	}
	return err
}

// changed reports whether fn changed doc from prev, the state it was given
// (compared as Go values, field by field, so a map's key order and a stored
// int32 read into an int64 field do not count as changes). fn may not
// change the id or a reserved field.
func (r *Repo[T]) changed(op string, id any, prev, doc reflect.Value) (bool, error) {
	changed := false
	for _, name := range r.s.names {
		index := r.s.mapped[name]
		if name == r.opts.VersionField || equal(prev.FieldByIndex(index), doc.FieldByIndex(index)) {
			continue
		}
		switch {
		case name == "_id":
			return false, &InvalidError{Op: op, Field: "_id", Reason: fmt.Sprintf("fn changed the id of %v", id)}
		case r.reserved(name):
			return false, &InvalidError{Op: op, Field: name, Reason: "fn changed a reserved field (Options.Reserved)"}
		}
		changed = true
	}
	return changed, nil
}

// diff returns the $set of each mapped field that differs between before
// (the document as read) and after (as the last fn left it), as raw (after's
// encoding) has it, and the $unset of each such field raw omits. Fields no
// fn changed are not written.
func (r *Repo[T]) diff(before, after reflect.Value, raw bson.Raw) (set, unset bson.D) {
	for _, name := range r.s.names {
		index := r.s.mapped[name]
		if name == r.opts.VersionField || equal(before.FieldByIndex(index), after.FieldByIndex(index)) {
			continue
		}
		if v, err := raw.LookupErr(name); err == nil {
			set = append(set, bson.E{Key: name, Value: v})
		} else {
			unset = append(unset, bson.E{Key: name, Value: ""})
		}
	}
	return set, unset
}

// decodeRaw decodes an encoded T into a new T at version ver.
func (r *Repo[T]) decodeRaw(op string, id any, raw bson.Raw, ver int64) (*T, error) {
	return r.decode(op, id, &docState{raw: raw, version: ver})
}

// equal reports whether two values of one field type are deeply equal,
// without boxing the common scalar kinds.
func equal(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.String:
		return a.String() == b.String()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return a.Int() == b.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return a.Uint() == b.Uint()
	case reflect.Bool:
		return a.Bool() == b.Bool()
	case reflect.Float32, reflect.Float64:
		return a.Float() == b.Float()
	default:
		return reflect.DeepEqual(a.Interface(), b.Interface())
	}
}

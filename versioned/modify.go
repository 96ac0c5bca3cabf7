package versioned

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// Modify reads the document with the given id, calls fn on a fresh copy of
// it, and writes fn's changes back if the document has not changed since it
// was read: one find and one write filtered on the id and the version read,
// that $sets the changed mapped fields, $unsets the removed ones and raises
// the version. It returns the document as stored. If fn changes nothing,
// nothing is written and the document as read is returned. Where the server
// runs update pipelines (MongoDB, DocumentDB), a call's first conflict is
// retried at once (later ones back off, then read): from a read after an
// uncontended write, an updateOne; from the document its write returned
// once the document has conflicted (for 5 s) or calls on it combine, when
// the write is a findOneAndUpdate that returns the current document: a
// conflict then costs one round trip.
//
// Calls on one document in one process wait in line (every Repo on the same
// collection of the same *mongo.Client shares it) instead of racing each
// other through the server. The call at the head reads once for itself and
// the calls behind it from the same Repo (up to 8), calls each fn in turn on
// a fresh copy of the state the fn before it left, and writes all their
// changes at once. Each call gets its own version (one above the state its
// fn saw), its own write id, and the document as its fn left it. An fn that
// returns an error, or changes nothing, adds nothing to the write; a call
// whose fn saw a state another fn left succeeds only if the write lands,
// else its fn runs again on the next read. A call whose ctx ends before its
// fn's turn returns ctx's error, wrapped, its fn not called; once its fn has
// started it waits for that attempt's outcome. Calls with a Where filter,
// WithSet or WithRetry, or whose ctx carries a session, take their turn
// alone. fn may run on another call's goroutine; its panic is raised again
// on its own call's goroutine, nothing of it written. fn must not call
// Modify for the same document through the same collection and client:
// that call would wait behind the one running fn until its ctx ends. With
// Options.ShardKey the line is per id and shard-key values, and an fn that
// changes a shard-key value is refused (*InvalidError), the others' changes
// written. With an Observer each call reports its own start, end, attempts
// and outcome, and a Conflict and a Retry event per attempt of its that a
// conflict failed (see the observe package, and DESIGN.md, "Combining").
//
// On a conflict (another process wrote the document in between) Modify
// calls fn again on the new state, under the retry policy (Options.Retry,
// or WithRetry): by default for up to [DefaultRetryTime], within the
// repository's retry budget. So fn may run several times; it must not have
// side effects that cannot be repeated. When the retries run out the error
// matches ErrConflict and retry.ErrExhausted (or retry.ErrBudgetExhausted).
//
// An error from fn aborts Modify without a write; Modify returns it wrapped,
// so errors.Is and errors.As reach it. fn must not change the id
// (*InvalidError); changes it makes to the version field are ignored. With
// Where filters, the document must match them when read (otherwise fn is
// not called and Modify returns a *GuardError, which matches the error of
// the first WhereErr filter found failing) and when written. WithSet fields
// are set by the write that carries fn's change, not when fn changes
// nothing. Inside a transaction (ctx carries a session with a transaction in
// progress) Modify makes one attempt, outside the line, and returns a
// *ConflictError as it is, for the transaction's own retry loop.
func (r *Repo[T]) Modify(ctx context.Context, id any, fn func(doc *T) error, opts ...WriteOption) (_ *T, err error) {
	const op = "modify"
	idv, key, err := r.start(ctx, op, id)
	if err != nil {
		return nil, err
	}
	m := &member[T]{fn: fn}
	ctx, m.ob = r.begin(ctx, op, idv)
	m.ctx = ctx
	defer r.end(&m.ob, &err)
	if fn == nil {
		return nil, &InvalidError{Op: op, Reason: "fn is nil"}
	}
	cfg, err := r.config(op, opts)
	if err != nil {
		return nil, err
	}
	if settle.InTransaction(ctx) {
		b := batch[T]{r: r, op: op, id: idv, key: key, cfg: &cfg, lead: m, ms: []*member[T]{m}}
		b.run(true)
		if m.panicked != nil {
			panic(m.panicked.value)
		}
		return m.out, m.err2
	}
	var class any = r
	if cfg.alone() || mongo.SessionFromContext(ctx) != nil {
		class = nil // alone: options of its own (writeFields), or a session
	}
	m.wt = waiter{class: class, self: m}
	m.w = &m.wt
	return r.inLine(ctx, op, idv, key, &cfg, m)
}

// member is one Modify call in a batch.
type member[T any] struct {
	w   *waiter         // nil outside a line
	wt  waiter          // what w points to
	ctx context.Context // the call's, as its Observer's Start returned it
	fn  func(doc *T) error
	// ob is the call's operation for the Observer: the batch updates it,
	// the call reports it when it returns.
	ob observed

	// The current attempt.
	res      *T       // the document as fn left it (or as fn saw it, if unchanged)
	wid      int64    // the write id of its change (0 for none)
	base     int64    // the version its change was made against
	fnErr    error    // fn's error
	panicked *fnPanic // fn panicked
	err      error    // why its change cannot be written (*InvalidError)
	real     bool     // fn saw the state as read, not one another fn left
	deferred bool     // left for the next batch
	left     bool     // gone before its fn's turn: withdrawn, or its context ended (see commit)
	// set and unset are its change as a write against the state read (when
	// real).
	set, unset bson.D

	// The outcome, once settled.
	done bool
	out  *T
	err2 error
}

// inLine waits for m's turn on the document, leads a batch when promoted,
// and returns m's outcome.
func (r *Repo[T]) inLine(ctx context.Context, op string, id any, key docKey, cfg *writeConfig, m *member[T]) (*T, error) {
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
			<-m.w.wake // its fn has started in this attempt, or it was settled: wait for that
		}
	}
}

// lead forms the batch m leads, runs it, and hands the line on.
func (r *Repo[T]) lead(op string, id any, key docKey, cfg *writeConfig, dk cacheID, m *member[T]) {
	b := &batch[T]{r: r, op: op, id: id, key: key, cfg: cfg, lead: m, lines: r.lines}
	ws := r.lines.take(dk, m.w, maxBatch, b.wbuf[:0])
	b.ms = b.mbuf[:0]
	for _, w := range ws {
		b.ms = append(b.ms, w.self.(*member[T])) //nolint:forcetypeassert // a class is one Repo[T]; m itself otherwise
	}
	ended := false
	defer func() {
		if ended {
			return
		}
		// The leader's goroutine is unwinding (a panic outside fn, or
		// runtime.Goexit in fn): settle the others and hand the line on.
		for _, x := range append([]*member[T](nil), b.ms...) {
			if x != m && !x.done && !x.left {
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
	key   docKey // the id and shard-key values every filter carries
	cfg   *writeConfig
	lead  *member[T]   // the call whose goroutine runs the batch
	ms    []*member[T] // the calls not settled yet, in line order
	lines *collLines   // nil outside a line (in a transaction)
	io    context.Context
	pre   *docState // the current document, as a failed CAS write returned it
	quick bool      // a conflict was retried at once, on the document a write returned
	once  bool      // one attempt, not under retry.Do

	mbuf [maxBatch]*member[T] // what ms starts in
	wbuf [maxBatch]*waiter
}

// errBatchEmpty ends a batch whose calls have all been settled or left.
var errBatchEmpty = errors.New("versioned: batch empty")

// run runs the batch under the policy (one attempt if once) and settles its
// calls. It returns the waiters of the calls it did not settle (left for a
// later batch, or the others when the leader's context ended), for the line.
func (b *batch[T]) run(once bool) []*waiter {
	r := b.r
	b.io = b.lead.ctx
	if len(b.ms) > 1 {
		var cancel context.CancelFunc
		b.io, cancel = b.sharedContext()
		defer cancel()
	}
	var err error
	b.once = once
	if once {
		err = b.attempt()
	} else {
		p := *r.policy(b.cfg)
		if p.Observer != nil {
			// Each call gets the retry events of the attempts it took part
			// in, in its own context; the fan-out marks the calls idle
			// after the Retry event (see batchObserver).
			p.Observer = &batchObserver[T]{b: b, to: p.Observer}
		} else if !b.alone() {
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
		if !b.lead.done {
			b.settle(b.lead, nil, b.leaderStopped(err))
		}
	default:
		err = b.final(err)
		for len(b.ms) > 0 {
			b.settle(b.ms[0], nil, b.errFor(err, b.ms[0])) // takes it out of b.ms
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

// leaderStopped is the error of a leader whose context ended, given the
// error err its batch stopped on: err itself when it carries the leader's
// context's error, else that error alone (the shared context's
// context.Canceled says nothing the leader's own does not).
func (b *batch[T]) leaderStopped(err error) error {
	cerr := store.ContextError(b.lead.ctx)
	if errors.Is(err, b.lead.ctx.Err()) {
		cerr = err
	}
	return wrapErr(b.op, b.id, cerr)
}

// stopped reports whether a retry loop ended by its context.
func stopped(err error) bool {
	return !errors.Is(err, ErrUnknownOutcome) &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// sharedContext returns the context of a batch's reads and writes: the
// leader's values, ended when every call's context has ended, so that the
// write is not cut short for the others.
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

// alone reports whether the batch is its leader alone, which cannot leave
// it: then nothing need be marked.
func (b *batch[T]) alone() bool {
	return b.lines == nil || (len(b.ms) == 1 && b.ms[0] == b.lead)
}

// join starts an attempt: it drops the calls that left the batch since the
// last one and counts the attempt for the others. They stay free to leave
// until their fn starts (see commit).
func (b *batch[T]) join() {
	if b.alone() {
		for _, m := range b.ms {
			m.ob.attempts++
		}
		return
	}
	b.prune(func(m *member[T]) {
		if m.w.state == wBusy { // an attempt retried at once: no idle in between
			m.w.state = wTaken
			m.w.signal()
		}
		m.ob.attempts++ // under the lock: the call reads it once it has left
	})
}

// prune drops, under the lines' lock, the calls that left the batch
// (withdrawn, or settled), and passes each other one to mark.
func (b *batch[T]) prune(mark func(m *member[T])) {
	c := b.lines
	c.mu.Lock()
	defer c.mu.Unlock()
	ms := b.ms[:0]
	for _, m := range b.ms {
		if !m.w.withdrawn && m.w.state != wDone {
			mark(m)
			ms = append(ms, m)
		}
	}
	clear(b.ms[len(ms):])
	b.ms = ms
}

// commit is called as m's fn is about to run. It marks m in progress, so
// that it can no longer leave the batch, and reports true. It reports false
// if m has left the batch (it returned its context's error), or if m's
// context has ended, in which case m is settled with its context's error:
// either way its fn does not run and m takes no part in the write.
func (b *batch[T]) commit(m *member[T]) bool {
	ended := func() {
		m.out, m.err2, m.done = nil, wrapErr(b.op, b.id, store.ContextError(m.ctx)), true
	}
	if b.lines == nil || m.w == nil {
		if m.ctx.Err() != nil {
			ended()
			return false
		}
		return true
	}
	c := b.lines
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case m.w.withdrawn || m.w.state == wDone:
		return false
	case m.ctx.Err() != nil:
		ended()
		m.w.state = wDone
		m.w.signal()
		return false
	}
	m.w.state = wBusy
	return true
}

// seal ends an attempt: it drops the calls that left the batch during it
// and marks the others in progress until idle, so that none leaves while
// the retry loop reports the attempt to the calls.
func (b *batch[T]) seal() {
	if !b.alone() {
		b.prune(func(m *member[T]) { m.w.state = wBusy })
	}
}

// idle marks the batch's calls as between attempts, and wakes them, so
// that one whose context ended meanwhile can leave.
func (b *batch[T]) idle() {
	if b.alone() {
		return
	}
	c := b.lines
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range b.ms {
		if m.w.state == wBusy {
			m.w.state = wTaken
			m.w.signal()
		}
	}
}

// settle gives m its outcome and takes it out of the batch.
func (b *batch[T]) settle(m *member[T], out *T, err error) {
	m.out, m.err2, m.done = out, err, true
	if m.w != nil {
		b.lines.settle(m.w)
	}
	if i := slices.Index(b.ms, m); i >= 0 {
		b.ms = slices.Delete(b.ms, i, i+1)
	}
}

// settleOwn settles m with its own result: the document its fn left, fn's
// error, or why its change could not be written.
func (b *batch[T]) settleOwn(m *member[T]) {
	switch {
	case m.panicked != nil:
		b.settle(m, nil, nil)
	case m.fnErr != nil:
		m.ob.aborted = true
		b.settle(m, nil, fmt.Errorf("versioned: %s %v: fn: %w", b.op, b.id, m.fnErr))
	case m.err != nil:
		b.settle(m, nil, m.err)
	default:
		b.settle(m, m.res, nil)
	}
}

// settleOwnIf settles with its own result each call that done accepts.
func (b *batch[T]) settleOwnIf(done func(m *member[T]) bool) {
	for i := 0; i < len(b.ms); {
		if m := b.ms[i]; done(m) {
			b.settleOwn(m) // takes it out of b.ms
			continue
		}
		i++
	}
}

// attempt is one read, the calls' fns, and one write. It returns nil when
// the batch is settled, and otherwise the error of the attempt, which is
// every unsettled call's unless the retry loop tries again.
func (b *batch[T]) attempt() error {
	b.join()
	if len(b.ms) == 0 {
		return retry.Permanent(errBatchEmpty)
	}
	err := b.try()
	b.seal()
	return err
}

// try is the body of attempt: the read, the fns of the calls still in the
// batch as each one's turn comes, and the write.
func (b *batch[T]) try() error {
	r, op, id := b.r, b.op, b.id
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
	k, last, raw := b.apply(st)
	// The calls found gone before their fn's turn: nothing of them is
	// written, and no event of the attempt reaches them.
	b.ms = slices.DeleteFunc(b.ms, func(m *member[T]) bool { return m.left })
	// A call whose fn saw the state as read and wrote nothing is settled:
	// its outcome does not depend on the write.
	b.settleOwnIf(func(m *member[T]) bool { return m.real && m.wid == 0 && !m.deferred })
	if k == 0 {
		return nil
	}
	set, unset := last.set, last.unset
	if !last.real {
		// Several changes: write what differs between the state read and
		// the last one.
		set, unset, _, _ = r.compare(op, id, st.raw, reflect.Value{}, valueOf(last.res), raw, true)
	}
	wids := make([]int64, 0, k)
	var to []context.Context // nil: the write's events go to b.io, the leader's alone
	for _, m := range b.ms {
		if m.wid != 0 {
			wids = append(wids, m.wid)
			if r.opts.Observer != nil && !b.alone() {
				to = append(to, m.ctx)
			}
		}
	}
	base := st.version
	out, err := r.casBatch(b.io, op, id, b.key, st, set, unset, wids, to, b.cfg)
	switch {
	case err != nil:
		return err
	case out.Applied:
		b.settleOwnIf(func(m *member[T]) bool { return !m.deferred })
		return nil
	case out.current != nil && settle.InTransaction(b.io):
		return b.conflicted(r.classify(b.io, op, id, b.key, base, out.current, b.cfg.guards))
	case out.current != nil:
		// The write returned the current document: the batch's first
		// conflict is retried at once from it, with no read and no backoff.
		// Only once: a document kept through a backoff is stale whenever
		// other processes keep writing (DESIGN.md, "Combining").
		err := b.conflicted(&ConflictError{Op: op, ID: id, Expected: base, Current: out.current.version})
		if b.quick || b.once {
			return err
		}
		b.quick, b.pre = true, out.current
		return retry.Immediately(err)
	case out.plain && !out.HasRead && !settle.InTransaction(b.io) && !b.quick && !b.once:
		// The updateOne form, sent as no conflict was expected: retried at
		// once, from a read, and (the document is hot now) in the pipeline
		// form.
		b.quick = true
		return retry.Immediately(b.conflicted(&ConflictError{Op: op, ID: id, Expected: base, Current: -1}))
	case !out.HasRead && !settle.InTransaction(b.io):
		// The next attempt's read, after the backoff, tells whether the
		// document moved, went away or fails the filters: no re-read
		// now, which saves a round trip per conflict.
		return b.conflicted(&ConflictError{Op: op, ID: id, Expected: base, Current: -1})
	}
	return b.conflicted(r.whyNotApplied(b.io, op, id, b.key, base, out.outcome, b.cfg.guards))
}

// conflicted reports err, if it is a *ConflictError, to the Observer once
// for each call whose fn ran in the attempt, in the call's own context, and
// returns it (DESIGN.md, "Combining", Events).
func (b *batch[T]) conflicted(err error) error {
	if b.r.opts.Observer == nil {
		return err
	}
	for _, m := range b.ms {
		if !m.deferred {
			_ = b.r.conflicted(m.ctx, err)
		}
	}
	return err
}

// batchObserver is the Observer of a batch's retry loop: it passes each
// retry.Do event to the Observer once for each call still in the batch, in
// the call's context, with the call's own Attempt; after a Retry event it
// marks the calls idle, so that no event reaches a call after its end.
type batchObserver[T any] struct {
	b  *batch[T]
	to observe.Observer
}

func (o *batchObserver[T]) Start(ctx context.Context, e observe.Event) context.Context {
	return o.to.Start(ctx, e)
}

func (o *batchObserver[T]) Observe(_ context.Context, e observe.Event) {
	for _, m := range o.b.ms {
		e.Attempt = m.ob.attempts
		o.to.Observe(m.ctx, e)
	}
	if e.Kind == observe.Retry {
		o.b.idle()
	}
}

// read reads the document for an attempt; with Where filters, it tells a
// failed filter from a missing document.
func (b *batch[T]) read() (*docState, error) {
	r, op, id, key, guards := b.r, b.op, b.id, b.key, b.cfg.guards
	st, err := r.find(b.io, r.coll, op, id, key, guards)
	if errors.Is(err, ErrNotFound) && len(guards) > 0 {
		// The guarded read missed: tell a failed guard from a missing
		// document. A failed re-read says neither.
		st, err := r.reread(b.io, r.coll, op, id, key)
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
// that did, and its encoding. A member gone before its turn (see commit) is
// marked left, its fn not called.
func (b *batch[T]) apply(st *docState) (k int, last *member[T], raw bson.Raw) {
	r, op, id := b.r, b.op, b.id
	var cur reflect.Value // the state the last change left; invalid: the state read
	raw, ver := st.raw, st.version
	for _, m := range b.ms {
		m.res, m.wid, m.base, m.fnErr, m.err, m.panicked, m.deferred = nil, 0, 0, nil, nil, nil, false
		m.set, m.unset = nil, nil
		m.real = k == 0
		if ver == lastVersion {
			m.deferred = true // the next batch reads the document and refuses it
			continue
		}
		if !b.commit(m) {
			m.left = true
			continue
		}
		doc, err := r.decode(op, id, &docState{raw: raw, version: ver})
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
		enc, encErr := r.encode(op, doc)
		var changed bool
		if encErr != nil {
			// Not writable as it is; fine if fn changed nothing.
			_, _, changed, err = r.compare(op, id, raw, cur, valueOf(doc), nil, false)
			if err == nil && changed {
				err = encErr
			}
		} else {
			// The change as a write: needed for the write when the state
			// fn saw is the state read, and to check the shard key.
			want := m.real || r.shard.Enabled()
			m.set, m.unset, changed, err = r.compare(op, id, raw, cur, valueOf(doc), enc, want)
			if err == nil && changed {
				// fn may not change a shard-key value (each state of the
				// batch has the values of b.key, which the read matched).
				err = r.keepsShard(op, id, b.key, m.set, m.unset)
			}
		}
		if err != nil {
			m.err = err
			continue
		}
		m.res = doc
		if !changed {
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
		st, rerr := r.reread(b.lead.ctx, r.coll, op, id, b.key)
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
	if m.wid != 0 && errors.As(err, &ue) && ue.WriteID != widText(m.wid) {
		c := *ue
		c.WriteID, c.Base = widText(m.wid), m.base
		return &c
	}
	return err
}

// compare compares doc, as fn left it, with prev, the state fn was given:
// prevRaw is its encoding, prevVal its value (invalid for the state read,
// which is not decoded twice). Fields whose encodings differ are compared
// as Go values, so a map's key order or a stored int32 read into an int64
// is no change; with enc nil (doc cannot be encoded), all are. It reports
// whether fn changed a field, refusing a change of the id or of a reserved
// field, and, if want, returns the $set of each changed field as enc (doc's
// encoding) has it and the $unset of each changed field enc omits.
func (r *Repo[T]) compare(op string, id any, prevRaw bson.Raw, prevVal, doc reflect.Value, enc bson.Raw, want bool) (set, unset bson.D, changed bool, err error) {
	for _, name := range r.s.names {
		if name == r.opts.VersionField {
			continue
		}
		a, aerr := prevRaw.LookupErr(name)
		e, eerr := enc.LookupErr(name)
		switch {
		case enc == nil: // no encoding to compare
		case aerr != nil && eerr != nil:
			continue // absent from both
		case aerr == nil && eerr == nil && a.Type == e.Type && bytes.Equal(a.Value, e.Value):
			continue
		}
		index := r.s.mapped[name]
		if same(prevVal, a, aerr == nil, doc.FieldByIndex(index), index) {
			continue
		}
		switch {
		case name == "_id":
			return nil, nil, false, &InvalidError{Op: op, Field: "_id", Reason: fmt.Sprintf("fn changed the id of %v", id)}
		case r.reserved(name):
			return nil, nil, false, &InvalidError{Op: op, Field: name, Reason: "fn changed a reserved field (Options.Reserved)"}
		}
		changed = true
		switch {
		case !want:
		case eerr == nil:
			set = append(set, bson.E{Key: name, Value: e})
		default:
			unset = append(unset, bson.E{Key: name, Value: ""})
		}
	}
	return set, unset, changed, nil
}

// same reports whether the field at index of doc, f, equals as a Go value
// the previous state's: prevVal's field when prevVal is valid, else the
// stored value a (absent when !present: the zero value) decoded into f's
// type. A stored value that does not decode counts as different.
func same(prevVal reflect.Value, a bson.RawValue, present bool, f reflect.Value, index []int) bool {
	if prevVal.IsValid() {
		return equal(prevVal.FieldByIndex(index), f)
	}
	old := reflect.New(f.Type())
	if present {
		if err := a.Unmarshal(old.Interface()); err != nil {
			return false
		}
	}
	return equal(old.Elem(), f)
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

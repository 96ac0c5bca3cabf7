package versioned

import (
	"context"
	"crypto/rand"
	"errors"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// newWriteID returns a fresh write id: 128 random bits as 26 base32
// characters, which are valid field names.
func newWriteID() string { return rand.Text() }

// inTransaction reports whether ctx carries a session with a transaction
// in progress.
func inTransaction(ctx context.Context) bool {
	s := mongo.SessionFromContext(ctx)
	return s != nil && s.TransactionRunning()
}

// verdict is what a re-read says about a write whose reply was lost.
type verdict int

const (
	// landed: the document shows the write.
	landed verdict = iota
	// live: the write has not landed, but a copy of it still in flight
	// could land later.
	live
	// dead: the write has not landed and never will.
	dead
	// unknown: the write may have landed and its trace be gone since.
	unknown
)

// sent is the outcome of sending a write once.
type sent struct {
	matched bool
	after   bson.Raw // the document after the write, when the reply has it
}

// write is one write of the repository, which exec sends and, after an
// ambiguous failure, resolves by re-reading.
type write struct {
	op   string
	id   any    // the caller's id, for errors
	key  docKey // the encoded id, and the shard-key values
	wid  string // the write id it stamps ("" for a delete)
	base int64  // the version it records with its write id
	send func(ctx context.Context) (sent, error)
	// judge tells what a re-read document (nil: no document) says, and
	// why, when it is unknown.
	judge func(st *docState) (verdict, string)
	// to, if not nil, are the contexts of the calls whose changes the write
	// carries (a combined Modify write): its Ambiguous and Settled events
	// go to each of them instead of the context exec runs in.
	to []context.Context
}

// outcome is the result of exec.
type outcome struct {
	landed bool
	after  bson.Raw  // the document after the write, if a reply carried it
	reread *docState // the last re-read (nil if none, or no document)
	read   bool      // a re-read was made
	// resent says the write was sent more than once: a copy other than the
	// one that landed may still be in flight.
	resent bool
}

// exec sends w and, if it fails ambiguously (see store.IsAmbiguous: a
// network error, a timeout, a write-concern error, an error labelled
// RetryableWriteError), re-reads the document to learn whether w landed:
// it reports landed, reports not landed when w can never land any more, and
// sends w again, with the same write id, while w has not landed but still
// could; every copy carries a filter that lets at most one of them apply.
// When a re-read cannot settle it, exec returns an *UnknownOutcomeError. It
// never returns an ambiguous error as it is, except inside a transaction,
// where the transaction, not the write, is the unit to retry.
func (r *Repo[T]) exec(ctx context.Context, p *retry.Policy, w *write) (out outcome, err error) {
	s, err := w.send(ctx)
	if err == nil {
		return outcome{landed: s.matched, after: s.after}, nil
	}
	if !store.IsAmbiguous(err) || inTransaction(ctx) {
		return outcome{}, wrapErr(w.op, w.id, err)
	}
	r.ambiguous(ctx, w, err)
	defer r.settled(ctx, w, &out, &err)
	first, noMatch := err, false
	for resends := 0; ; {
		st, rerr := r.reread(ctx, p, w)
		if rerr != nil {
			var vte *VersionTypeError
			if errors.As(rerr, &vte) {
				return outcome{}, rerr
			}
			return outcome{}, r.unknown(w, nil, "re-reading the document failed", errors.Join(first, rerr))
		}
		v, why := w.judge(st)
		switch v {
		case landed:
			return outcome{landed: true, reread: st, read: true, resent: resends > 0}, nil
		case dead:
			return outcome{reread: st, read: true, resent: resends > 0}, nil
		case unknown:
			return outcome{}, r.unknown(w, st, why, first)
		case live:
		}
		// live: a copy may still land. Send it again while the caller waits.
		switch {
		case noMatch:
			return outcome{}, r.unknown(w, st, "the write's condition no longer holds, but a copy of it may still be in flight", first)
		case ctx.Err() != nil:
			return outcome{}, r.unknown(w, st, "the context ended while a copy of the write may still be in flight", errors.Join(first, store.ContextError(ctx)))
		case resends >= maxResends:
			return outcome{}, r.unknown(w, st, "the write kept failing ambiguously", first)
		}
		resends++
		s, err = w.send(ctx)
		switch {
		case err == nil && s.matched:
			return outcome{landed: true, after: s.after, resent: true}, nil
		case err == nil:
			noMatch = true
		case !store.IsAmbiguous(err):
			return outcome{}, r.unknown(w, st, "sending the write again failed", errors.Join(first, err))
		}
	}
}

// reread reads the document by id after an ambiguous write, with read
// concern majority, retrying transient failures under policy p. It runs
// for at most ResolveTimeout, whether or not ctx has ended meanwhile, since
// the caller must learn what became of its write (the write itself may have
// failed on ctx's deadline). It returns nil when there is no document.
//
// Majority, because after a writeConcernError on a replica set the primary
// may hold the write and then lose it in a rollback: a local read could
// report landed a write that is undone later. A majority read shows only
// what no rollback can undo, so a write it shows has landed for good, and a
// write it does not show yet is judged as not landed yet: the copy sent
// again matches nothing where the write did land (the filters see to it),
// and the outcome is then unknown rather than guessed.
func (r *Repo[T]) reread(ctx context.Context, p *retry.Policy, w *write) (*docState, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.ResolveTimeout)
	defer cancel()
	return retry.DoValue(rctx, *p, func(ctx context.Context) (*docState, error) {
		st, err := r.findIn(ctx, r.settle, w.op, w.id, w.key, nil)
		if errors.Is(err, ErrNotFound) {
			return nil, nil // no document is an answer here, which the judges judge
		}
		return st, err
	})
}

// find reads the document with id key that also matches the guards.
func (r *Repo[T]) find(ctx context.Context, op string, id any, key docKey, guards []guard) (*docState, error) {
	return r.findIn(ctx, r.coll, op, id, key, guards)
}

// findIn is find through coll (the repository's collection, or settle).
func (r *Repo[T]) findIn(ctx context.Context, coll *mongo.Collection, op string, id any, key docKey, guards []guard) (*docState, error) {
	filter := withGuards(key.Filter(), guards)
	raw, err := coll.FindOne(ctx, filter).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, &NotFoundError{Op: op, ID: id}
	}
	if err != nil {
		return nil, wrapErr(op, id, err)
	}
	st, err := r.readState(op, id, raw)
	if err != nil {
		return nil, err
	}
	r.cache.observe(cacheKey(key), st)
	return st, nil
}

func (r *Repo[T]) unknown(w *write, st *docState, reason string, err error) error {
	cur := int64(-1)
	if st != nil {
		cur = st.version
	}
	return &UnknownOutcomeError{Op: w.op, ID: w.id, WriteID: w.wid, Base: w.base, Current: cur, Reason: reason, Err: err}
}

// Reasons an outcome is unknown.
const (
	whyGone      = "the document was deleted since (or is not majority-committed): the write may have landed before"
	whyOther     = "the document was deleted and inserted again since: the write may have landed on the one deleted"
	whyFar       = "more write ids than the document keeps were added since"
	whyUnrelated = "the document is at a version that cannot follow the write's: it was deleted and inserted again since (the write may have landed on the one deleted), or the majority-committed state has not caught up yet"
)

// judgeCAS judges a write filtered on version == base (and, if incKnown, on
// incarnation inc) that pushes write id w.wid. Versions of one
// incarnation only grow, one per write, and every write pushes exactly one
// id at the end of the list, which loses ids only from its front: so the
// list holds the ids of the writes that made the last nids versions. A
// version names its incarnation (Insert starts each at a random one), so a
// document at base, or a little past it, is the incarnation the write
// targeted. See DESIGN.md.
func judgeCAS(w *write, inc string, incKnown bool) func(*docState) (verdict, string) {
	return judgeSpan(w, inc, incKnown, 1)
}

// classify tells why a write filtered on id, version == expected (and an
// incarnation) and the guards matched nothing, from a re-read st (nil: no
// document). A failed Where filter wins over a moved version: the caller's
// fence (a lease, say) is what stopped the write, and retrying will not
// help.
func (r *Repo[T]) classify(ctx context.Context, op string, id any, key docKey, expected int64, st *docState, guards []guard) error {
	if st == nil {
		r.cache.forget(cacheKey(key))
		return &NotFoundError{Op: op, ID: id}
	}
	if len(guards) > 0 {
		failed, err := r.guardsFail(ctx, op, id, key, guards)
		if err != nil {
			return err
		}
		if failed {
			return r.guardError(ctx, op, id, key, st.version, guards)
		}
	}
	return &ConflictError{Op: op, ID: id, Expected: expected, Current: st.version}
}

// guardsFail reports whether the document fails one of the guards (or is
// gone).
func (r *Repo[T]) guardsFail(ctx context.Context, op string, id any, key docKey, guards []guard) (bool, error) {
	_, err := r.find(ctx, op, id, key, guards)
	if errors.Is(err, ErrNotFound) {
		return true, nil
	}
	return false, err
}

// guardError builds the *GuardError of a write whose conditions failed,
// checking each WhereErr filter to learn which failed.
func (r *Repo[T]) guardError(ctx context.Context, op string, id any, key docKey, ver int64, guards []guard) error {
	ge := &GuardError{Op: op, ID: id, Version: ver}
	for _, g := range guards {
		if g.failErr == nil {
			continue
		}
		if _, err := r.find(ctx, op, id, key, []guard{g}); errors.Is(err, ErrNotFound) {
			ge.Err = g.failErr
			break
		}
	}
	return ge
}

// rereadNow reads the document to classify a failed write; a missing
// document is nil.
func (r *Repo[T]) rereadNow(ctx context.Context, op string, id any, key docKey) (*docState, error) {
	st, err := r.find(ctx, op, id, key, nil)
	if errors.Is(err, ErrNotFound) {
		return nil, nil //nolint:nilnil // no document is an answer here, which the callers judge
	}
	return st, err
}

package versioned

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
)

// newWriteID returns a fresh write id: a random non-zero int64 (ChaCha8,
// seeded from the OS; a false match has probability about WriteIDs/2^64).
func newWriteID() int64 {
	for {
		if id := int64(mrand.Uint64()); id != 0 { //nolint:gosec // any bit pattern is an id
			return id
		}
	}
}

// widText is a write id as UnknownOutcomeError.WriteID shows it.
func widText(wid int64) string { return strconv.FormatUint(uint64(wid), 16) } //nolint:gosec // the bits as they are

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
	wid  int64  // the write id it stamps (0 for a delete)
	base int64  // the version it records with its write id
	send func(ctx context.Context) (sent, error)
	// judge tells what a re-read document (nil: no document) says, and
	// why, when it is unknown.
	judge func(st *docState) (settle.Verdict, string)
	// to, if not nil, are the contexts of the calls whose changes a
	// combined write carries: its settling events go to each of them.
	to []context.Context
}

// outcome is the result of exec: Read is the last re-read (nil if none, or
// no document), Reply the document after the write if a reply carried it.
type outcome = settle.Result[bson.Raw, *docState]

// exec sends w through the settling engine: after an ambiguous failure it
// re-reads the document at majority (settle.Majority) and, by w's judge,
// reports landed, not landed, or sends w again with the same write id (every
// copy's filter lets at most one apply). A write it cannot settle is an
// *UnknownOutcomeError; inside a transaction an ambiguous error is returned
// as it is.
func (r *Repo[T]) exec(ctx context.Context, p *retry.Policy, w *write) (outcome, error) {
	res, err := settle.Exec(ctx, settle.Config{
		Retry:          *p,
		ResolveTimeout: r.opts.ResolveTimeout,
		Pass:           isVersionTypeError,
		Ambiguous:      func(err error) { r.settling(ctx, w, observe.Ambiguous, 0, err) },
		Settled:        func(s observe.Settlement, err error) { r.settling(ctx, w, observe.Settled, s, err) },
	}, settle.Write[bson.Raw, *docState]{
		Send: func(ctx context.Context) (bson.Raw, bool, error) {
			s, err := w.send(ctx)
			return s.after, s.matched, err
		},
		Read: func(ctx context.Context) (st *docState, err error) {
			err = r.majority.Read(ctx, func(coll *mongo.Collection) error {
				st, err = r.reread(ctx, coll, w.op, w.id, w.key)
				return err
			})
			return st, err
		},
		Judge:  w.judge,
		Resend: true,
		Unknown: func(st *docState, _ bool, reason string, err error) error {
			cur := int64(-1)
			if st != nil {
				cur = st.version
			}
			return &UnknownOutcomeError{
				Pkg: "versioned", Op: w.op, ID: w.id, WriteID: widText(w.wid),
				Base: w.base, Current: cur, Reason: reason, Err: err,
			}
		},
	})
	var ue *UnknownOutcomeError
	switch {
	case err == nil:
	case errors.As(err, &ue), isVersionTypeError(err):
		return outcome{}, err
	default:
		return outcome{}, wrapErr(w.op, w.id, err)
	}
	return res, nil
}

func isVersionTypeError(err error) bool {
	var vte *VersionTypeError
	return errors.As(err, &vte)
}

// find reads through coll the document with id key that also matches the
// guards.
func (r *Repo[T]) find(ctx context.Context, coll *mongo.Collection, op string, id any, key docKey, guards []guard) (*docState, error) {
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

// Reasons an outcome is unknown.
const (
	whyGone      = "the document was deleted since (or is not majority-committed): the write may have landed before"
	whyOther     = "the document was deleted and inserted again since: the write may have landed on the one deleted"
	whyFar       = "more write ids than the document keeps were added since"
	whyUnrelated = "the document is at a version that cannot follow the write's: it was deleted and inserted again since (the write may have landed on the one deleted), or the majority-committed state has not caught up yet"
)

// classify tells why a write filtered on id, version == expected (and an
// incarnation) and the guards matched nothing, from a re-read st (nil: no
// document). A failed Where filter wins over a moved version: retrying will
// not help.
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
	_, err := r.find(ctx, r.coll, op, id, key, guards)
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
		if _, err := r.find(ctx, r.coll, op, id, key, []guard{g}); errors.Is(err, ErrNotFound) {
			ge.Err = g.failErr
			break
		}
	}
	return ge
}

// reread reads the document through coll to settle or classify a write; a
// missing document is nil.
func (r *Repo[T]) reread(ctx context.Context, coll *mongo.Collection, op string, id any, key docKey) (*docState, error) {
	st, err := r.find(ctx, coll, op, id, key, nil)
	if errors.Is(err, ErrNotFound) {
		return nil, nil //nolint:nilnil // no document is an answer here, which the callers judge
	}
	return st, err
}

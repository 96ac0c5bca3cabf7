package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/store"
)

// Keys keeps idempotency keys in one collection: a record per key (and
// scope). Keys is safe for concurrent use; goroutines sharing it share its
// claim owner.
type Keys struct {
	coll     *mongo.Collection
	majority *settle.Majority // for settling re-reads
	leases   *lease.Manager
	c        config
}

// Func is the work of a request with an idempotency key, run at most once
// per claim of the key; c records checkpoints. A nil error makes the Result
// final: stored, and every retry gets it. An error is transient: nothing is
// stored, Do returns it, and a retry runs Func again, from the last
// checkpoint. ctx ends if the claim is lost.
type Func func(ctx context.Context, c *Call) (Result, error)

// Result is what a request produced: an HTTP response, or any value the
// caller encodes in Body and Status.
type Result struct {
	// Status is the HTTP status code, or any code of the caller's.
	Status int
	// Header holds the response's header fields.
	Header http.Header
	// Body is the response body, or the caller's encoded value.
	Body []byte
	// Replayed is true for a result stored by an earlier call with the key.
	Replayed bool
	// Epoch is the epoch of the claim whose run produced the result.
	Epoch int64
}

// CallOption tunes one call of Do.
type CallOption func(*callOptions)

type callOptions struct{ scope string }

// InScope puts the key in a scope of its own, such as the authenticated
// user or API key: the same key in two scopes names two records. A scope is
// valid UTF-8 of at most MaxScopeLen bytes without NUL. The default is "".
func InScope(scope string) CallOption { return func(o *callOptions) { o.scope = scope } }

// keyRef names a key's record.
type keyRef struct{ id, key, scope string }

// New returns Keys that keep their records in coll, a collection of their
// own. It does no I/O; it fails only for a nil coll or invalid opts, with an
// error matching ErrInvalid. See [Keys.EnsureIndexes] for the clean-up.
func New(coll *mongo.Collection, opts *Options) (*Keys, error) {
	if coll == nil {
		return nil, &OptionsError{Field: "coll", Reason: "is nil"}
	}
	c, lo, err := opts.config()
	if err != nil {
		return nil, err
	}
	leases, err := lease.New(coll, lo)
	if err != nil {
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	return &Keys{coll: coll, majority: settle.NewMajority(coll), leases: leases, c: c}, nil
}

// Collection returns the collection of the key records.
func (k *Keys) Collection() *mongo.Collection { return k.coll }

// Owner returns the owner string these Keys write into their claims.
func (k *Keys) Owner() string { return k.leases.Owner() }

// TTL returns the TTL of a claim.
func (k *Keys) TTL() time.Duration { return k.c.ttl }

// Retention returns how long a record is kept after its request last ran.
func (k *Keys) Retention() time.Duration { return k.c.retention }

// Do runs fn once for key, as the first request with it, or returns what the
// first request stored:
//
//   - The first call with a key (in its scope) finds no record, inserts it
//     with the request's fingerprint and its claim, runs fn, and stores fn's
//     Result (if fn returned no error) in the write that releases the claim:
//     3 round trips around fn.
//   - A later call with the same fingerprint gets the stored Result (with
//     Replayed set) from one read, without running anything.
//   - A call while another holds the claim gets an *InProgressError (nothing
//     ran); once the claim is released without a result or expired, the next
//     call claims it and runs fn again, with the checkpoints recorded so far
//     (a claim and a start of the run more than a first call).
//   - A call with another fingerprint gets a *MismatchError.
//
// fingerprint identifies the request's content (for HTTP, see
// [DefaultFingerprint]); the record keeps its SHA-256; an empty one is
// valid. fn's error is returned as it is (wrapped in a *lease.LostError,
// matching ErrLost, if the claim was lost while fn ran). When fn's Result
// could not be stored (ErrLost; ErrUnknownOutcome), Do returns it with the
// error.
func (k *Keys) Do(ctx context.Context, key string, fingerprint []byte, fn Func, opts ...CallOption) (Result, error) {
	if err := store.CheckContext(ctx); err != nil {
		return Result{}, fmt.Errorf("idempotency: key %s: %w", quoteKey(key), err)
	}
	if fn == nil {
		return Result{}, fmt.Errorf("idempotency: key %s: nil function: %w", quoteKey(key), ErrInvalid)
	}
	var co callOptions
	for _, o := range opts {
		if o != nil {
			o(&co)
		}
	}
	ref, err := newRef(co.scope, key)
	if err != nil {
		return Result{}, err
	}
	return k.do(ctx, ref, digest(fingerprint),
		func(ctx context.Context, c *Call) (Result, bool, error) {
			r, err := fn(ctx, c)
			return r, err == nil, err
		})
}

// innerFunc is Func with its verdict: a final result is stored.
type innerFunc func(ctx context.Context, c *Call) (res Result, final bool, err error)

// maxOpens bounds how often do reads a record deleted before each claim.
const maxOpens = 3

// do answers from the key's record when it can, else runs fn under a claim.
func (k *Keys) do(ctx context.Context, ref keyRef, fp []byte, fn innerFunc) (Result, error) {
	for opens := 1; ; opens++ {
		rec, err := one(k.coll.FindOne(ctx, idFilter(ref.id)))
		if err != nil {
			return Result{}, fmt.Errorf("idempotency: key %s: open: %w", quoteKey(ref.key), err)
		}
		if res, ok, err := k.answer(ctx, ref, fp, rec); ok {
			return res, err
		}
		res, err := k.run(ctx, ref, fp, rec == nil, fn)
		var gone *RecordGoneError
		if !errors.As(err, &gone) {
			return res, err
		}
		if gone.Opens = opens; opens == maxOpens {
			return Result{}, gone
		}
	}
}

// answer is what rec answers without running anything (ok): a replay, or a
// *MismatchError.
func (k *Keys) answer(ctx context.Context, ref keyRef, fp []byte, rec *record) (res Result, ok bool, err error) {
	switch {
	case rec == nil:
	case !bytes.Equal(rec.FP, fp):
		k.report(ctx, observe.KeyMismatch, ref, nil)
		return Result{}, true, &MismatchError{Key: ref.key}
	case rec.Result != nil:
		k.report(ctx, observe.KeyReplayed, ref, nil)
		return rec.Result.replay(), true, nil
	}
	return Result{}, false, nil
}

// run runs fn under a claim of the record (lease's Do, or DoInsert for a
// new key), and stores its result in the claim's release.
func (k *Keys) run(ctx context.Context, ref keyRef, fp []byte, fresh bool, fn innerFunc) (Result, error) {
	var (
		entered, ran, stored bool
		res                  Result
		fnErr                error
		c                    = &Call{k: k, ref: ref, attempt: 1, rid: bson.NewObjectID(), names: map[string]chan struct{}{}}
	)
	body := func(ctx context.Context, l *lease.Lease) error {
		entered, c.l = true, l
		if !fresh {
			rec, err := k.begin(ctx, ref, l)
			if err != nil {
				return err
			}
			// Completed, or made again by another request, since it was read.
			if r, ok, err := k.answer(ctx, ref, fp, &rec); ok {
				res, stored = r, err == nil
				return err
			}
			c.rid, c.attempt, c.points = rec.RID, rec.Attempts, rec.Points
		}
		r, final, err := fn(ctx, c)
		ran = true
		if err != nil {
			fnErr = err
			return err
		}
		r.Epoch = l.Epoch()
		res = r
		if !final {
			return nil
		}
		if err := k.complete(ctx, ref, l, r); err != nil {
			return err
		}
		stored = true
		k.report(ctx, observe.KeyCompleted, ref, func(e *observe.Event) { e.Attempt, e.Epoch = c.attempt, l.Epoch() })
		return nil
	}
	var err error
	if fresh {
		var now time.Time
		if now, err = k.estimate(ctx); err != nil {
			return Result{}, fmt.Errorf("idempotency: key %s: open: %w", quoteKey(ref.key), err)
		}
		err = k.leases.DoInsert(ctx, ref.id, bson.D{
			{Key: "rid", Value: c.rid}, {Key: "key", Value: ref.key}, {Key: "scope", Value: ref.scope},
			{Key: "fp", Value: fp}, {Key: "attempts", Value: 1},
			{Key: "createdAt", Value: now}, {Key: "expireAt", Value: now.Add(k.c.retention)},
		}, body)
	} else {
		err = k.leases.Do(ctx, ref.id, body)
	}
	var (
		held       *lease.HeldError
		unknownErr *UnknownOutcomeError
	)
	switch {
	case stored:
		return res, nil // a failed plain release after a replay: the claim expires
	case ran && fnErr == nil && err == nil:
		return res, nil // not final: returned, not stored
	case ran && fnErr != nil:
		return Result{}, err // fn's error (wrapped by lease if the claim was lost)
	case ran && errors.As(err, &unknownErr) && unknownErr.Op == "complete":
		return res, unknownErr // complete's (the claim's end that lease adds is its own)
	case ran:
		return res, err // a final result that could not be stored
	case !entered && errors.As(err, &held):
		k.report(ctx, observe.KeyInProgress, ref, func(e *observe.Event) {
			e.Holder, e.Epoch, e.TimeLeft = held.Owner, held.Epoch, held.TimeLeft
		})
		return Result{}, &InProgressError{Key: ref.key, Owner: held.Owner, Epoch: held.Epoch, TimeLeft: held.TimeLeft}
	case !entered && (errors.Is(err, lease.ErrNotFound) || store.IsDuplicateKey(err)):
		return Result{}, &RecordGoneError{Key: ref.key, Err: err} // or made by another request
	case err != nil && !entered:
		return Result{}, fmt.Errorf("idempotency: key %s: claim: %w", quoteKey(ref.key), err)
	}
	return Result{}, err // begin's error, already prefixed
}

// estimate is the Clock's estimate of the server's time.
func (k *Keys) estimate(ctx context.Context) (time.Time, error) {
	est, err := k.leases.Clock().Now(ctx)
	if err != nil {
		return time.Time{}, err
	}
	return est.Time.Truncate(time.Millisecond), nil
}

// unknown is the *UnknownOutcomeError of op on ref's record.
func unknown(op string, ref keyRef, reason string, err error) error {
	return &UnknownOutcomeError{Pkg: "idempotency", Op: op, ID: ref.key, Subject: "key " + quoteKey(ref.key), Reason: reason, Err: err}
}

// begin marks the record as run by the claim l, fenced on it (epoch, and
// attempts counted), and returns the record.
func (k *Keys) begin(ctx context.Context, ref keyRef, l *lease.Lease) (record, error) {
	now, err := k.estimate(ctx)
	if err != nil {
		return record{}, fmt.Errorf("idempotency: key %s: begin: %w", quoteKey(ref.key), err)
	}
	epoch := l.Epoch()
	update := bson.D{
		{Key: "$set", Value: bson.D{{Key: "epoch", Value: epoch}, {Key: "expireAt", Value: now.Add(k.c.retention)}}},
		{Key: "$inc", Value: bson.D{{Key: "attempts", Value: 1}}},
	}
	opts := options.FindOneAndUpdate().SetReturnDocument(options.After)
	send := func(ctx context.Context) (record, bool, error) {
		// A second copy changes nothing: attempts counts claims, not sends.
		filter := append(fenced(ref.id, l), bson.E{Key: "epoch", Value: bson.D{{Key: "$ne", Value: epoch}}})
		rec, err := one(k.coll.FindOneAndUpdate(ctx, filter, update, opts))
		if rec == nil || err != nil {
			return record{}, false, err
		}
		return *rec, true, nil
	}
	landed := func(rec record) (bool, bool) { return rec.Epoch == epoch, rec.Epoch > epoch }
	return k.fencedWrite(ctx, "begin", ref, l, send, landed)
}

// complete stores the result of the claim l and releases it, in one write
// (lease's ReleaseWith), on a context that outlives ctx by ResolveTimeout.
func (k *Keys) complete(ctx context.Context, ref keyRef, l *lease.Lease, r Result) error {
	ctx, cancel := settle.Detached(ctx, k.c.resolve)
	defer cancel()
	now, err := k.estimate(ctx)
	if err != nil {
		return fmt.Errorf("idempotency: key %s: complete: %w", quoteKey(ref.key), err)
	}
	epoch := l.Epoch()
	s := storedResult{Status: r.Status, Header: headerFields(r.Header), Body: r.Body, Epoch: epoch, At: now}
	err = l.ReleaseWith(ctx, bson.D{{Key: "result", Value: s}, {Key: "epoch", Value: epoch}, {Key: "expireAt", Value: now.Add(k.c.retention)}})
	var (
		lost *lease.LostError
		u    *UnknownOutcomeError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &u):
		return unknown("complete", ref, u.Reason, u.Err)
	case errors.As(err, &lost) && lost.Reason == lease.Expired:
		// Expired here, yet stored if nobody claimed it since: the record tells.
		if rec, rerr := k.reread(ctx, ref.id); rerr == nil && rec != nil && rec.Result != nil && rec.Result.Epoch == epoch {
			return nil
		}
	}
	return fmt.Errorf("idempotency: key %s: complete: %w", quoteKey(ref.key), err)
}

// fencedWrite sends a write fenced on the claim l through settle.Exec, with
// landed judging a re-read (DESIGN.md, "Ambiguous writes").
func (k *Keys) fencedWrite(ctx context.Context, op string, ref keyRef, l *lease.Lease,
	send func(context.Context) (record, bool, error), landed func(record) (mine, later bool)) (record, error) {
	read := func(ctx context.Context) (*record, error) { return k.reread(ctx, ref.id) }
	judge := func(rec *record) (settle.Verdict, string) {
		if rec == nil {
			return settle.Dead, "" // deleted: the claim is gone with it
		}
		switch mine, later := landed(*rec); {
		case mine:
			return settle.Landed, ""
		case later:
			return settle.Dead, ""
		}
		return settle.Live, ""
	}
	res, err := settle.Exec(ctx, k.settling(ctx, op, ref), settle.Write[record, *record]{
		Send: send, Read: read, Judge: judge, Resend: true,
		Unknown: func(_ *record, _ bool, reason string, err error) error { return unknown(op, ref, reason, err) },
	})
	switch {
	case errors.Is(err, ErrUnknownOutcome): // the engine's, built by unknown
		return record{}, err
	case err != nil:
		return record{}, fmt.Errorf("idempotency: key %s: %s: %w", quoteKey(ref.key), op, err)
	case res.Applied && res.HasReply:
		return res.Reply, nil
	case res.Applied:
		return *res.Read, nil
	case !res.HasRead:
		rec, err := settle.Reread(ctx, k.c.settling(), read)
		if err != nil {
			return record{}, fmt.Errorf("idempotency: key %s: %s: read after a fenced write matched nothing: %w", quoteKey(ref.key), op, err)
		}
		if v, _ := judge(rec); v == settle.Landed {
			return *rec, nil
		}
	}
	if err := l.Err(); errors.Is(err, lease.ErrLost) {
		return record{}, fmt.Errorf("idempotency: key %s: %s: %w", quoteKey(ref.key), op, err)
	}
	return record{}, fmt.Errorf("idempotency: key %s: %s: the claim of epoch %d no longer holds the key: %w", quoteKey(ref.key), op, l.Epoch(), ErrLost)
}

// fenced is the filter of a write made under the claim l.
func fenced(id string, l *lease.Lease) bson.D {
	return append(idFilter(id), l.Fence()...)
}

// idFilter is {_id: {$eq: id}}.
func idFilter(id string) bson.D {
	return bson.D{{Key: "_id", Value: bson.D{{Key: "$eq", Value: id}}}}
}

// one decodes the record a find returned; nil if there is none.
func one(r *mongo.SingleResult) (*record, error) {
	raw, err := r.Raw()
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return nil, nil //nolint:nilnil // no record is an answer here, which the callers judge
	case err != nil:
		return nil, err
	}
	var rec record
	if err := bson.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("decode the key record: %w", err)
	}
	return &rec, nil
}

// reread reads the record of id at majority (settle.Majority); nil if none.
func (k *Keys) reread(ctx context.Context, id string) (rec *record, err error) {
	err = k.majority.Read(ctx, func(coll *mongo.Collection) error {
		rec, err = one(coll.FindOne(ctx, idFilter(id)))
		return err
	})
	return rec, err
}

// report sends the Observer, if there is one, the event of kind about ref's
// key, with the facts set adds.
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

// settling is the engine's configuration for a write op of ref's key, with
// the Ambiguous and Settled events when there is an Observer.
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

package lease

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// Manager claims, renews and releases leases in one collection. A Manager made
// by New leases existing documents of that collection; one made by NewNamed
// leases names, each stored as a lock document whose _id is the name. A
// Manager is safe for concurrent use; goroutines sharing it share its owner.
type Manager struct {
	coll  *mongo.Collection
	named bool
	c     config

	// Dotted paths of the lease record's fields.
	pOwner, pEpoch, pExpires, pAcquired, pClaim string

	claimOpts   *options.FindOneAndUpdateOptionsBuilder // with a projection to the lease field
	claimOptsNP *options.FindOneAndUpdateOptionsBuilder // without: for servers that lack it
	noProject   atomic.Bool                             // the server rejected claimOpts' projection
	readOpts    *options.FindOneOptionsBuilder
}

// New returns a Manager for leases on the documents of coll. The lease record
// is kept in the subdocument Options.Field of each document, which the
// document's own model must not map. A document must exist before it can be
// leased. New does no I/O; it fails only for a nil coll or invalid opts, with
// an error matching ErrInvalidOptions.
func New(coll *mongo.Collection, opts *Options) (*Manager, error) {
	return newManager(coll, opts, false)
}

// NewNamed returns a Manager for named leases ("partner-api:user:42"): each
// name is the _id of a lock document in coll, created by the first claim
// (an upsert) and kept afterwards so that its epoch keeps increasing. See
// EnsureIndexes for the clean-up of stale lock documents. NewNamed does no
// I/O; it fails only for a nil coll or invalid opts.
func NewNamed(coll *mongo.Collection, opts *Options) (*Manager, error) {
	return newManager(coll, opts, true)
}

func newManager(coll *mongo.Collection, opts *Options, named bool) (*Manager, error) {
	if coll == nil {
		return nil, fmt.Errorf("lease: nil collection: %w", ErrInvalidOptions)
	}
	c, err := resolve(coll.Database().Client(), opts)
	if err != nil {
		return nil, err
	}
	f := c.field
	m := &Manager{
		coll:      coll,
		named:     named,
		c:         c,
		pOwner:    f + ".owner",
		pEpoch:    f + ".epoch",
		pExpires:  f + ".expiresAt",
		pAcquired: f + ".acquiredAt",
		pClaim:    f + ".claim",
	}
	proj := bson.D{{Key: f, Value: 1}}
	m.claimOpts = options.FindOneAndUpdate().
		SetReturnDocument(options.After).
		SetProjection(proj).
		SetUpsert(named)
	m.claimOptsNP = options.FindOneAndUpdate().
		SetReturnDocument(options.After).
		SetUpsert(named)
	m.readOpts = options.FindOne().SetProjection(proj)
	return m, nil
}

// Owner returns the owner string this Manager writes into the leases it
// claims.
func (m *Manager) Owner() string { return m.c.owner }

// TTL returns the lease duration.
func (m *Manager) TTL() time.Duration { return m.c.ttl }

// Field returns the name of the lease subdocument.
func (m *Manager) Field() string { return m.c.field }

// Clock returns the estimate of the server's clock the Manager judges expiry
// by.
func (m *Manager) Clock() *store.Clock { return m.c.clock }

// Collection returns the collection the Manager works on.
func (m *Manager) Collection() *mongo.Collection { return m.coll }

// TryAcquire claims the lease on id with one findOneAndUpdate and returns at
// once. It returns a *HeldError (matching ErrHeld) when another owner holds a
// live lease, and, for a Manager made by New, an error matching ErrNotFound
// when no document has that _id. The returned lease's context keeps ctx's
// values but not its cancellation: it ends when the lease is released or
// lost. See the package documentation for every error.
func (m *Manager) TryAcquire(ctx context.Context, id any) (*Lease, error) {
	if err := m.check(ctx, "acquire", id); err != nil {
		return nil, err
	}
	return m.claim(ctx, id, context.WithoutCancel(ctx))
}

// Acquire claims the lease on id, waiting while another owner holds it: after
// each failed attempt it sleeps the next delay of Options.Retry or the time
// left on the holder's lease, whichever is shorter, and tries again, until it
// holds the lease or ctx ends. Transient errors (network, timeouts) are
// retried the same way; other errors, such as ErrNotFound, end it at once.
// When ctx ends the error wraps both ctx's error and the last attempt's
// error. The returned lease's context is as for TryAcquire.
func (m *Manager) Acquire(ctx context.Context, id any) (*Lease, error) {
	if err := m.check(ctx, "acquire", id); err != nil {
		return nil, err
	}
	return m.acquire(ctx, id, context.WithoutCancel(ctx))
}

func (m *Manager) acquire(ctx context.Context, id any, parent context.Context) (*Lease, error) {
	bo := m.c.retry.NewBackoff()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var lastHeld error // the last *HeldError, for the error when ctx ends
	for {
		l, err := m.claim(ctx, id, parent)
		if err == nil {
			return l, nil
		}
		var held *HeldError
		var wait time.Duration
		switch {
		case ctx.Err() != nil && lastHeld != nil && !errors.As(err, &held):
			// ctx ended during an attempt: say who held the lease before.
			return nil, fmt.Errorf("%w; before that: %w", err, lastHeld)
		case errors.As(err, &held):
			lastHeld = held
			wait = min(bo.Next(), held.TimeLeft)
		case errors.Is(err, ErrUncertain) || retry.IsRetryable(err):
			wait = bo.Next()
		default:
			return nil, err
		}
		wait = max(wait, time.Millisecond)
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lease: acquire %v: %w; last attempt: %w", id, ctxErr(ctx), err)
		case <-timer.C:
		}
	}
}

// check rejects a call before any I/O: an ended context or an invalid id.
func (m *Manager) check(ctx context.Context, op string, id any) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("lease: %s %v: %w", op, id, ctxErr(ctx))
	}
	if why := invalidID(id); why != "" {
		return fmt.Errorf("lease: %s: id %s: %w", op, why, ErrInvalidID)
	}
	return nil
}

// ctxErr returns ctx.Err(), joined with its cause when that differs.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// invalidID returns why id cannot name a lease, or "".
func invalidID(id any) string {
	switch v := id.(type) {
	case nil:
		return "is nil"
	case string:
		if v == "" {
			return "is an empty string"
		}
	case bson.ObjectID:
		if v.IsZero() {
			return "is the zero ObjectID"
		}
	default:
		rv := reflect.ValueOf(id)
		switch rv.Kind() {
		case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface:
			if rv.IsNil() {
				return fmt.Sprintf("is a nil %T", id)
			}
		default: // not nil-able: any value is an id the server may accept
		}
	}
	return ""
}

// record is the lease subdocument.
type record struct {
	Owner      string        `bson:"owner"`
	Epoch      int64         `bson:"epoch"`
	ExpiresAt  time.Time     `bson:"expiresAt"`
	AcquiredAt time.Time     `bson:"acquiredAt"`
	Claim      bson.ObjectID `bson:"claim"`
}

func (m *Manager) decode(doc bson.Raw) (record, error) {
	var r record
	v := doc.Lookup(m.c.field) // the zero RawValue when absent
	if v.Type == 0 || v.Type == bson.TypeNull {
		return r, nil // no lease record yet
	}
	if _, ok := v.DocumentOK(); !ok {
		return r, fmt.Errorf("lease: field %q holds a %v, not a lease record", m.c.field, v.Type)
	}
	if err := v.Unmarshal(&r); err != nil {
		return r, fmt.Errorf("lease: decode field %q: %w", m.c.field, err)
	}
	return r, nil
}

// held reports whether r is a live lease as judged on est: it has an owner
// and its expiry is not before the earliest the server's clock can read.
func held(r record, est store.Estimate) bool {
	return r.Owner != "" && !r.ExpiresAt.Before(cutoff(est))
}

// cutoff is the expiry before which a lease is surely expired: the earliest
// the server's clock can read, rounded down to BSON's millisecond.
func cutoff(est store.Estimate) time.Time { return est.Earliest().Truncate(time.Millisecond) }

// timeLeft is how long until held(r, est) turns false if r is not renewed.
func timeLeft(r record, est store.Estimate) time.Duration {
	return max(r.ExpiresAt.Sub(est.Earliest())+time.Millisecond, 0)
}

// read returns the lease record of id, retrying transient failures for a
// short while. found is false when no document has that _id.
func (m *Manager) read(ctx context.Context, id any) (r record, found bool, err error) {
	err = retry.Do(ctx, retry.Policy{MaxElapsedTime: m.resolveTimeout()}, func(ctx context.Context) error {
		raw, err := m.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}, m.readOpts).Raw()
		if errors.Is(err, mongo.ErrNoDocuments) {
			found = false
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		r, err = m.decode(raw)
		return retry.Permanent(err)
	})
	return r, found, err
}

// reread is read after an ambiguous write, on a context that lives on for
// resolveTimeout when ctx has ended (a timeout is one cause of ambiguity).
func (m *Manager) reread(ctx context.Context, id any) (record, bool, error) {
	rctx, cancel := m.detached(ctx)
	defer cancel()
	return m.read(rctx, id)
}

// resolveTimeout bounds the work done after an operation's own context has
// ended: re-reading after an ambiguous write, releasing after Do. A lease
// expires by itself after TTL, so more than that is not worth waiting.
func (m *Manager) resolveTimeout() time.Duration {
	return min(max(m.c.ttl, time.Second), 10*time.Second)
}

// detached returns a context for finishing work after ctx may have ended.
func (m *Manager) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), m.resolveTimeout())
}

// ambiguous reports whether a write that failed with err may have been
// applied. A write interrupted by its context's end counts too: the request
// may already have reached the server.
func ambiguous(err error) bool {
	return store.IsAmbiguous(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// maxClaimAttempts bounds how often one TryAcquire claims again after finding
// the lease free or expired on re-reading, under heavy churn.
const maxClaimAttempts = 3

// claim is TryAcquire without the argument checks. parent is the parent of the
// lease's context.
func (m *Manager) claim(ctx context.Context, id any, parent context.Context) (*Lease, error) {
	for attempt := 1; ; attempt++ {
		t0 := m.c.now()
		est, err := m.c.clock.Now(ctx)
		if err != nil {
			return nil, fmt.Errorf("lease: acquire %v: %w", id, err)
		}
		expires := est.Time.Add(m.c.ttl).Truncate(time.Millisecond)
		claimID := bson.NewObjectID()
		filter := bson.D{
			{Key: "_id", Value: id},
			{Key: "$or", Value: bson.A{
				bson.D{{Key: m.pOwner, Value: nil}},
				bson.D{{Key: m.pExpires, Value: bson.D{{Key: "$lt", Value: cutoff(est)}}}},
			}},
		}
		update := bson.D{
			{Key: "$set", Value: bson.D{
				{Key: m.pOwner, Value: m.c.owner},
				{Key: m.pExpires, Value: expires},
				{Key: m.pAcquired, Value: est.Time.Truncate(time.Millisecond)},
				{Key: m.pClaim, Value: claimID},
			}},
			{Key: "$inc", Value: bson.D{{Key: m.pEpoch, Value: int64(1)}}},
		}
		raw, err := m.findAndModify(ctx, filter, update)
		var (
			rec      record
			found    bool
			haveRead bool
		)
		switch {
		case err == nil:
			rec, err = m.decode(raw)
			if err != nil {
				return nil, err
			}
			if rec.Owner != m.c.owner || rec.Claim != claimID {
				return nil, fmt.Errorf("lease: acquire %v: the server returned a record that is not this claim (owner %q)", id, rec.Owner)
			}
			return m.newLease(ctx, parent, id, rec, t0, est)
		case errors.Is(err, mongo.ErrNoDocuments):
			// Not claimable: learn why below.
		case m.named && store.IsDuplicateKey(err):
			// The upsert lost an insert race: another owner's claim made the
			// lock document first. Held, not an error.
		case ambiguous(err):
			var rerr error
			rec, found, rerr = m.reread(ctx, id)
			if rerr != nil {
				return nil, &UncertainError{Op: "acquire", ID: id, Err: err, ReadErr: rerr}
			}
			haveRead = true
			if found && rec.Owner == m.c.owner && rec.Claim == claimID {
				// The claim was applied; only its reply was lost.
				return m.newLease(ctx, parent, id, rec, t0, est)
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("lease: acquire %v: %w", id, ctxErr(ctx))
			}
		default:
			return nil, fmt.Errorf("lease: acquire %v: %w", id, err)
		}

		if !haveRead {
			rec, found, err = m.read(ctx, id)
			if err != nil {
				return nil, fmt.Errorf("lease: acquire %v: read after a failed claim: %w", id, err)
			}
		}
		if !found && !m.named {
			return nil, fmt.Errorf("lease: acquire %v: %w", id, ErrNotFound)
		}
		est, err = m.c.clock.Now(ctx)
		if err != nil {
			return nil, fmt.Errorf("lease: acquire %v: %w", id, err)
		}
		if (found && held(rec, est)) || attempt >= maxClaimAttempts {
			return nil, &HeldError{ID: id, Owner: rec.Owner, Epoch: rec.Epoch, ExpiresAt: rec.ExpiresAt, TimeLeft: timeLeft(rec, est)}
		}
		// Released or expired since the claim was judged: claim again.
	}
}

// codeNotImplemented is the error code of a command option the server does
// not implement (FerretDB v1 answers it for findAndModify's projection).
const codeNotImplemented = 238

// findAndModify sends a claim, with a projection to the lease field unless
// the server has rejected that once: the claim is then not applied, and is
// sent again without it.
func (m *Manager) findAndModify(ctx context.Context, filter, update bson.D) (bson.Raw, error) {
	if !m.noProject.Load() {
		raw, err := m.coll.FindOneAndUpdate(ctx, filter, update, m.claimOpts).Raw()
		var se mongo.ServerError
		if !errors.As(err, &se) || !se.HasErrorCode(codeNotImplemented) {
			return raw, err
		}
		m.noProject.Store(true)
	}
	return m.coll.FindOneAndUpdate(ctx, filter, update, m.claimOptsNP).Raw()
}

// newLease makes the Lease for a claim of rec sent after local time t0 with
// the server-time estimate est (taken after t0). If the claim's reply came
// too late for any of the lease to be usable, or ctx ended meanwhile, it
// releases the claim and fails.
func (m *Manager) newLease(ctx context.Context, parent context.Context, id any, rec record, t0 time.Time, est store.Estimate) (*Lease, error) {
	l := &Lease{
		m:          m,
		id:         id,
		epoch:      rec.Epoch,
		acquiredAt: rec.AcquiredAt,
		expiresAt:  rec.ExpiresAt,
		lastSent:   rec.ExpiresAt,
		deadline:   m.deadline(t0, est, rec.ExpiresAt),
	}
	l.ctx, l.cancel = context.WithCancelCause(parent)
	left := l.deadline.Sub(m.c.now())
	var fail error
	switch {
	case ctx.Err() != nil:
		fail = fmt.Errorf("lease: acquire %v: %w", id, ctxErr(ctx))
	case left <= 0:
		fail = &LostError{ID: id, Owner: m.c.owner, Epoch: l.epoch, Reason: Expired}
	}
	if fail != nil {
		rctx, cancel := m.detached(ctx)
		_ = l.Release(rctx)
		cancel()
		_ = l.finish(fail)
		return nil, fail
	}
	l.mu.Lock()
	l.timer = time.AfterFunc(left, l.onDeadline)
	l.mu.Unlock()
	return l, nil
}

// deadline is the local time (on Options.Now) before which nobody else can see
// a lease expiring at server time expires as expired, for a write whose
// estimate est was taken after local time t0, minus the safety margin.
//
// At t0 the server's clock read at most est.Latest(). It gains at most
// DriftRate on the local clock, so it reaches expires no sooner than
// (expires − est.Latest())×(1 − DriftRate) after t0, which is at least
// expires − est.Latest() − TTL×DriftRate since expires − est.Latest() ≤ TTL.
// Others judge expiry by the earliest the server's clock can read, which is
// never later than the server's clock itself.
func (m *Manager) deadline(t0 time.Time, est store.Estimate, expires time.Time) time.Time {
	drift := time.Duration(float64(m.c.ttl) * m.c.drift)
	return t0.Add(expires.Sub(est.Latest()) - drift - m.c.margin)
}

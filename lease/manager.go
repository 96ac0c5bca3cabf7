package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/internal/shard"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// Manager claims, renews and releases leases in one collection. A Manager made
// by New leases existing documents of that collection; one made by NewNamed
// leases names, each stored as a lock document whose _id is the name. A
// Manager is safe for concurrent use; goroutines sharing it share its owner.
type Manager struct {
	coll     *mongo.Collection
	majority *settle.Majority             // every read of a record (see read)
	stamped  atomic.Pointer[collMajority] // Stamp's majority reader (majorityOf)
	named    bool
	c        config

	// Dotted paths of the lease record's fields.
	pOwner, pEpoch, pExpires, pAcquired, pRenewed, pClaim, pRenewal, pFirst string

	mode atomic.Int32 // the resolved Mode; ModeAuto until known

	claimOpts   *options.FindOneAndUpdateOptionsBuilder // with a projection to the lease field
	claimOptsNP *options.FindOneAndUpdateOptionsBuilder // without: for servers that lack it
	upsertOpts  *options.FindOneAndUpdateOptionsBuilder // for a lock document that may not exist
	noProject   atomic.Bool                             // the server rejected claimOpts' projection
	readOpts    *options.FindOneOptionsBuilder

	lines     *lines   // where Acquire and Do wait for their turn
	estimated template // a claim in ModeEstimated
}

// New returns a Manager for leases on the documents of coll. The lease record
// is kept in the subdocument Options.Field of each document, which the
// document's own model must not map. A document must exist before it can be
// leased. New does no I/O; it fails only for a nil coll or invalid opts, with
// an *OptionsError matching ErrInvalid.
func New(coll *mongo.Collection, opts *Options) (*Manager, error) {
	return newManager(coll, opts, false)
}

// NewNamed returns a Manager for named leases ("partner-api:user:42"): each
// name is the _id of a lock document in coll, created by the first claim.
// The lease protects other documents through [Lease.Stamp] and
// [Lease.Fence]. See [Manager.EnsureIndexes] for the clean-up of stale lock
// documents. Every command on a lock document filters on its _id alone: on
// a sharded cluster, shard coll on hashed _id (or leave it unsharded) and
// each is sent to one shard. NewNamed does no I/O; it fails only for a nil
// coll or invalid opts.
func NewNamed(coll *mongo.Collection, opts *Options) (*Manager, error) {
	return newManager(coll, opts, true)
}

func newManager(coll *mongo.Collection, opts *Options, named bool) (*Manager, error) {
	if coll == nil {
		return nil, &OptionsError{Field: "coll", Reason: "is nil"}
	}
	c, err := resolve(coll.Database().Client(), opts)
	if err != nil {
		return nil, err
	}
	if named && c.Retain != "" {
		return nil, &OptionsError{Field: "Retain", Reason: "applies to document leases only: a named lease's lock document is not the one it protects"}
	}
	f := c.Field
	m := &Manager{
		coll:      coll,
		majority:  settle.NewMajority(coll),
		named:     named,
		c:         c,
		pOwner:    f + ".owner",
		pEpoch:    f + ".epoch",
		pExpires:  f + ".expiresAt",
		pAcquired: f + ".acquiredAt",
		pRenewed:  f + ".renewedAt",
		pClaim:    f + ".claim",
		pRenewal:  f + ".renewal",
		pFirst:    f + ".first",
	}
	m.mode.Store(int32(c.Mode)) //nolint:gosec // resolve accepts only the three modes
	proj := bson.D{{Key: f, Value: 1}}
	m.claimOpts = options.FindOneAndUpdate().SetReturnDocument(options.After).SetProjection(proj)
	m.claimOptsNP = options.FindOneAndUpdate().SetReturnDocument(options.After)
	m.upsertOpts = options.FindOneAndUpdate().SetReturnDocument(options.After).SetUpsert(true)
	m.readOpts = options.FindOne().SetProjection(proj)
	m.lines = linesOf(coll, f)
	m.estimated = newTemplate(m)
	return m, nil
}

// Owner returns the owner string this Manager writes into the leases it
// claims.
func (m *Manager) Owner() string { return m.c.Owner }

// TTL returns the lease duration.
func (m *Manager) TTL() time.Duration { return m.c.TTL }

// Field returns the name of the lease subdocument.
func (m *Manager) Field() string { return m.c.Field }

// Clock returns the estimate of the server's clock the Manager judges expiry
// by in ModeEstimated.
func (m *Manager) Clock() *store.ServerClock { return m.c.Clock }

// Collection returns the collection the Manager works on.
func (m *Manager) Collection() *mongo.Collection { return m.coll }

// TryAcquire claims the lease on id with one findOneAndUpdate and returns at
// once. It returns a *HeldError (matching ErrHeld) when another owner holds a
// live lease, and, for a Manager made by New, an error matching ErrNotFound
// when no document has that _id. The returned lease's context keeps ctx's
// values but not its cancellation: it ends when the lease is released or
// lost. A session or transaction in ctx is not used: the lease's own
// commands never run inside the caller's transaction.
func (m *Manager) TryAcquire(ctx context.Context, id any) (l *Lease, err error) {
	id, raw, err := m.check(ctx, "acquire", id)
	if err != nil {
		return nil, err
	}
	ctx, ob := m.begin(ctx, opTryAcquire, id)
	defer m.end(&ob, &err)
	l, err = m.claim(ctx, id, raw, context.WithoutCancel(ctx), nil)
	m.acquired(ctx, opTryAcquire, l, ob.start)
	return l, err
}

// Acquire claims the lease on id, waiting while another owner holds it.
// Calls for one lease in one process (through any Manager on the same
// collection and lease field of the same *mongo.Client) wait in line, first
// come, first served, sending nothing: when the lease a call got ends, the
// next claims at once; a call whose context ends in line leaves it. The call
// whose turn it is claims; while another process holds the lease it reads
// the record to learn when that lease is up and sleeps until then (cut
// short when a lease of the id ends in this process), no sleep ending past
// MaxElapsedTime, trying one claim half-way while more than four
// steps of Options.Retry (MaxInterval) are left, never sleeping more than
// five steps at once, until it holds the lease, ctx ends, or the Policy's
// MaxAttempts, MaxElapsedTime or Budget stop it. Transient errors are
// retried with the Policy's backoff; other errors, such as ErrNotFound, end
// it at once. An attempt whose outcome was unknown is settled by the next:
// if the record shows that claim, Acquire holds the lease; if that claim's
// deadline has passed meanwhile, Acquire releases it and claims again. With
// Options.Retry.MaxAttempts 1 there is no wait and no line: one claim, as
// TryAcquire makes. When ctx ends the error wraps both ctx's error and the
// last attempt's. The returned lease's context is as for TryAcquire.
func (m *Manager) Acquire(ctx context.Context, id any) (l *Lease, err error) {
	id, raw, err := m.check(ctx, "acquire", id)
	if err != nil {
		return nil, err
	}
	ctx, ob := m.begin(ctx, opAcquire, id)
	defer m.end(&ob, &err)
	l, err = m.acquire(ctx, id, raw, context.WithoutCancel(ctx))
	m.acquired(ctx, opAcquire, l, ob.start)
	return l, err
}

// again marks an error Acquire retries whatever the store classifiers say
// (a held lease, an unknown claim to settle).
type again struct{ error }

func (e again) Unwrap() error   { return e.error }
func (e again) Retryable() bool { return true }

// claimWaiting claims the lease on id, waiting while another owner holds it
// (see Acquire). wake, when signalled, cuts a sleep short: a lease of the id
// ended in this process.
func (m *Manager) claimWaiting(ctx context.Context, id any, raw docKey, parent context.Context, wake <-chan struct{}) (*Lease, error) {
	p := m.c.Retry
	if p.MaxAttempts == 0 {
		p.MaxAttempts = -1
	}
	if p.MaxElapsedTime == 0 {
		p.MaxElapsedTime = -1
	}
	var sleep time.Duration
	base := cmp.Or[store.Clock](p.Clock, store.SystemClock())
	p.Clock = wakeClock{base: base, sleep: &sleep, wake: wake}
	limit := base.Now().Add(p.MaxElapsedTime) // when positive: no sleep ends later
	var (
		l    *Lease
		w    waiting
		last error
	)
	err := retry.Do(ctx, p, func(ctx context.Context) error {
		var err error
		l, err = m.claim(ctx, id, raw, parent, &w)
		last, sleep = err, 0
		var lost *LostError
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrHeld):
			if sleep = m.pollDelay(w.due.Sub(m.c.Now())); p.MaxElapsedTime > 0 {
				sleep = max(min(sleep, limit.Sub(base.Now())), time.Millisecond)
			}
		case errors.Is(err, ErrUnknownOutcome):
		case errors.As(err, &lost) && lost.Reason == Expired:
			// A claim settled too late, released by newLease: claim again.
			sleep = time.Millisecond
		default:
			return err
		}
		return again{err}
	})
	stopped := errors.Is(err, retry.ErrExhausted) || errors.Is(err, retry.ErrBudgetExhausted)
	if last == nil || !stopped && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return l, err // done, or the attempt's own error, returned as is
	}
	// Stopped by ctx or by the Policy: say so, with the last attempt, and the
	// holder found last if ctx ended during an attempt.
	why := err.Error()
	switch cerr := store.ContextError(ctx); {
	case cerr != nil:
		why = cerr.Error()
	case errors.Is(err, retry.ErrBudgetExhausted):
		why = "retries stopped (retry budget exhausted)"
	case stopped:
		why = "retries stopped (attempts or time used up)"
	}
	msg := fmt.Sprintf("lease: acquire %v: %s", idText(id), why)
	errs := []error{err}
	if h := w.held; h != nil && !errors.Is(last, ErrHeld) {
		errs = append(errs, h)
		msg += fmt.Sprintf("; held by %q (epoch %d) before that", h.Owner, h.Epoch)
	}
	if h := (*HeldError)(nil); errors.As(last, &h) {
		msg += fmt.Sprintf("; last attempt: held by %q (epoch %d) for up to %v more", h.Owner, h.Epoch, h.TimeLeft)
	} else {
		msg += "; last attempt: " + last.Error()
	}
	return nil, &joined{msg: msg, errs: errs}
}

// pollDelay is how long Acquire sleeps after finding the lease held with
// left to go (see Acquire).
func (m *Manager) pollDelay(left time.Duration) time.Duration {
	step := cmp.Or(m.c.Retry.MaxInterval, retry.DefaultMaxInterval)
	if left > 4*step {
		return min(left/2, 5*step)
	}
	return max(left, time.Millisecond)
}

// check rejects a call before any I/O: a nil or ended context or an invalid
// id. It returns the bare id and its docKey.
func (m *Manager) check(ctx context.Context, op string, id any) (any, docKey, error) {
	if err := store.CheckContext(ctx); err != nil {
		return nil, docKey{}, fmt.Errorf("lease: %s %s: %w", op, idText(id), err)
	}
	spec := m.c.shard
	if k, ok := id.(Key); ok && len(k.Shard) > 0 && m.named {
		return nil, docKey{}, fmt.Errorf("lease: %s: %w", op, &store.IDError{ID: id, Reason: fmt.Sprintf("a named lease is found by its name alone: pass the name, and shard the lock collection on hashed _id (Options.ShardKey %s is the shard key of the documents Stamp writes)", m.c.shard)})
	} else if m.named {
		spec = shard.Spec{}
	}
	bare, raw, err := key(spec, id)
	if err != nil {
		return nil, docKey{}, fmt.Errorf("lease: %s: %w", op, err)
	}
	return bare, raw, nil
}

// idText formats an id for a message, cut short: ids come from requests.
func idText(id any) string {
	s := fmt.Sprint(id)
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return s
}

// record is the lease subdocument.
type record struct {
	Owner      string        `bson:"owner"`
	Epoch      int64         `bson:"epoch"`
	ExpiresAt  time.Time     `bson:"expiresAt"`
	AcquiredAt time.Time     `bson:"acquiredAt"`
	RenewedAt  time.Time     `bson:"renewedAt"`
	Claim      bson.ObjectID `bson:"claim"`
	Renewal    bson.ObjectID `bson:"renewal"`
	First      int64         `bson:"first"` // ModeEstimated: the epoch a first claim gets (firstEpoch)
}

func (m *Manager) decode(doc bson.Raw) (record, error) {
	var r record
	v := doc.Lookup(m.c.Field) // the zero RawValue when absent
	if v.Type == 0 || v.Type == bson.TypeNull {
		return r, nil // no lease record yet
	}
	if _, ok := v.DocumentOK(); !ok {
		return r, fmt.Errorf("lease: field %q holds a %v, not a lease record", m.c.Field, v.Type)
	}
	if err := v.Unmarshal(&r); err != nil {
		return r, fmt.Errorf("lease: decode field %q: %w", m.c.Field, err)
	}
	return r, nil
}

// cutoff is the expiry before which a lease is surely expired: the earliest
// the server's clock can read, rounded down to BSON's millisecond.
func cutoff(est store.Estimate) time.Time { return est.Earliest().Truncate(time.Millisecond) }

// snapshot is a lease record as read, with the server's time of the read in
// ModeServer (zero in ModeEstimated).
type snapshot struct {
	rec   record
	found bool
	now   time.Time
}

// read returns the lease record of id (with the server's $$NOW if server),
// retrying transient failures for up to ResolveTimeout. It reads at
// majority: a claim a replica set rolls back later never shows (DESIGN.md).
func (m *Manager) read(ctx context.Context, raw docKey, server bool) (snapshot, error) {
	return retry.DoValue(store.NoSession(ctx), m.readPolicy(), m.reader(raw, server))
}

// reader is one attempt of read, and the settling engine's Write.Read.
func (m *Manager) reader(raw docKey, server bool) func(context.Context) (snapshot, error) {
	return func(ctx context.Context) (s snapshot, err error) {
		err = m.majority.Read(store.NoSession(ctx), func(coll *mongo.Collection) error {
			s, err = m.readOnce(ctx, coll, raw, server)
			return err
		})
		return s, err
	}
}

// readPolicy is the reads' retry policy: the Manager's, for ResolveTimeout.
func (m *Manager) readPolicy() retry.Policy {
	return retry.Policy{MaxElapsedTime: m.c.ResolveTimeout, Budget: m.c.Retry.Budget, OnRetry: m.c.Retry.OnRetry, Observer: m.c.Retry.Observer, Clock: m.c.Retry.Clock}
}

// readOnce is one read of read, on coll.
func (m *Manager) readOnce(ctx context.Context, coll *mongo.Collection, raw docKey, server bool) (s snapshot, err error) {
	var doc bson.Raw
	if server {
		cur, err := coll.Aggregate(ctx, mongo.Pipeline{
			{{Key: "$match", Value: raw.Filter()}},
			{{Key: "$project", Value: bson.D{{Key: m.c.Field, Value: 1}, {Key: "now", Value: "$$NOW"}}}},
		})
		if err != nil {
			return s, err
		}
		defer func() { _ = cur.Close(context.WithoutCancel(ctx)) }()
		if !cur.Next(ctx) {
			return s, cur.Err() // nil: not found
		}
		doc = cur.Current
		s.now, _ = doc.Lookup("now").TimeOK()
	} else if doc, err = coll.FindOne(ctx, raw.Filter(), m.readOpts).Raw(); errors.Is(err, mongo.ErrNoDocuments) {
		return s, nil
	} else if err != nil {
		return s, err
	}
	s.found = true
	s.rec, err = m.decode(doc)
	return s, retry.Permanent(err)
}

// detached returns a context for finishing work after ctx may have ended,
// bounded by ResolveTimeout, without ctx's session.
func (m *Manager) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return settle.Detached(store.NoSession(ctx), m.c.ResolveTimeout)
}

// Mode returns the mode the Manager judges expiry in: Options.Mode if it was
// forced, else the one found by trying the server (once per client, see
// store.For, on the first call that needs it; a failure to reach the server
// is returned and tried again next time).
func (m *Manager) Mode(ctx context.Context) (Mode, error) {
	if err := store.CheckContext(ctx); err != nil {
		return ModeAuto, fmt.Errorf("lease: mode: %w", err)
	}
	server, err := m.serverMode(store.NoSession(ctx))
	switch {
	case err != nil:
		return ModeAuto, fmt.Errorf("lease: mode: %w", err)
	case server:
		return ModeServer, nil
	default:
		return ModeEstimated, nil
	}
}

// serverMode reports whether the Manager runs in ModeServer (in ModeAuto,
// from the client's store.Capabilities).
func (m *Manager) serverMode(ctx context.Context) (bool, error) {
	if mode := Mode(m.mode.Load()); mode != ModeAuto {
		return mode == ModeServer, nil
	}
	caps, err := store.For(m.coll.Database().Client()).Capabilities(ctx, m.coll.Database())
	if err != nil {
		return false, err
	}
	mode := ModeEstimated
	if caps.Expr && caps.UpdatePipelines {
		mode = ModeServer
	}
	m.mode.Store(int32(mode))
	return mode == ModeServer, nil
}

// Key names a document of a sharded collection by its _id and its
// shard-key values, for TryAcquire, Acquire and Do on a Manager made by New
// with Options.ShardKey, and for Stamp on a named lease's Manager with
// Options.ShardKey:
//
//	l, err := m.TryAcquire(ctx, lease.Key{ID: userID, Shard: bson.D{{Key: "tenant", Value: tenant}}})
//
// It is [store.Key]; see there for what is checked.
type Key = store.Key

// docKey names a leased (or stamped) document in every filter on it: the
// encoded _id and the shard-key values (none for a lock document).
type docKey = shard.Doc

// parseShardKey checks Options.ShardKey: no field may be under the lease
// record or the fence stamps, which every claim or Stamp changes.
func parseShardKey(fields []string, c *config) (shard.Spec, error) {
	spec, err := shard.Parse(fields, func(root string) string {
		switch root {
		case c.Field:
			return "is the lease record (Options.Field)"
		case c.FenceField:
			return "holds the fence stamps (Options.FenceField)"
		}
		return ""
	})
	if err != nil {
		return shard.Spec{}, &OptionsError{Field: "ShardKey", Reason: err.Error()}
	}
	return spec, nil
}

// key checks id, a Key or a bare id, against spec and returns the bare id
// and its docKey. Errors match ErrInvalidID.
func key(spec shard.Spec, id any) (any, docKey, error) {
	bare, vals, err := spec.Split(id)
	if err != nil {
		return nil, docKey{}, err
	}
	raw, err := store.CheckID(bare)
	if err != nil {
		return nil, docKey{}, err
	}
	return bare, docKey{ID: raw, Shard: vals}, nil
}

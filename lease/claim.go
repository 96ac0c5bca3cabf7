package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/store"
)

// attempt is one claim sent: its claim id, the local time before it was
// sent, and (in ModeEstimated) the estimate it was computed from.
type attempt struct {
	claim  bson.ObjectID
	t0     time.Time
	est    store.Estimate
	server bool
}

// maxClaimAttempts bounds how often one TryAcquire claims again after finding
// the lease free or expired on re-reading, under heavy churn.
const maxClaimAttempts = 3

// estimate returns the Clock's estimate, refusing one that cannot be used
// (the zero Estimate, a negative bound) as if the Clock had none.
func (m *Manager) estimate(ctx context.Context) (store.Estimate, error) {
	est, err := m.c.clock.Now(ctx)
	if err != nil {
		return est, err
	}
	if est.Time.IsZero() || est.Bound < 0 || est.Time.Year() < 1971 {
		return store.Estimate{}, fmt.Errorf("%w: the clock gave an unusable estimate (%v ± %v)", store.ErrNoServerTime, est.Time, est.Bound)
	}
	return est, nil
}

// claim is TryAcquire without the argument checks. parent is the parent of
// the lease's context. pending, when not nil, holds the claims of earlier
// attempts whose outcome was unknown: a record showing one of them is ours.
func (m *Manager) claim(ctx context.Context, id any, raw docKey, parent context.Context, pending *[]attempt) (*Lease, error) {
	ctx = store.NoSession(ctx)
	server, err := m.serverMode(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease: acquire %v: %w", idText(id), err)
	}
	for try := 1; ; try++ {
		a := attempt{claim: bson.NewObjectID(), t0: m.c.now(), server: server}
		if !server {
			if a.est, err = m.estimate(ctx); err != nil {
				return nil, fmt.Errorf("lease: acquire %v: %w", idText(id), err)
			}
		}
		filter, update := m.claimOp(raw, a)
		l, s, done, err := m.send(ctx, parent, id, raw, a, pending, func(ctx context.Context) (bson.Raw, error) {
			return m.findAndModify(ctx, filter, update)
		})
		switch {
		case done:
			return l, err
		case err == nil:
			// Not applied as far as a majority knows; it may still be (a
			// write the server has not run yet): it is pending, and a later
			// read that shows it settles it.
			if cerr := store.ContextError(ctx); cerr != nil {
				return nil, fmt.Errorf("lease: acquire %v: %w", idText(id), cerr)
			}
		case errors.Is(err, ErrUnknownOutcome):
			return nil, err
		case errors.Is(err, mongo.ErrNoDocuments):
			if s, err = m.read(ctx, raw, server); err != nil {
				return nil, fmt.Errorf("lease: acquire %v: read after a failed claim: %w", idText(id), err)
			}
		default:
			// DocumentDB refuses $$NOW in a findAndModify on a collection
			// that does not exist yet; any refusal on a document that does
			// not exist is that document's absence.
			// The same refusal raced with another owner's first claim, which
			// made the collection: judge what is there now (once more at
			// most).
			var rerr error
			if s, rerr = m.read(ctx, raw, server); rerr != nil || (s.found && try >= maxClaimAttempts) {
				return nil, fmt.Errorf("lease: acquire %v: %w", idText(id), err)
			}
		}

		if l, ok, err := m.settle(ctx, parent, id, raw, s, pending); ok || err != nil {
			return l, err
		}
		if !s.found && !m.named {
			return nil, fmt.Errorf("lease: acquire %v: %w", idText(id), ErrNotFound)
		}
		if !s.found || (!server && s.rec.Epoch == 0 && s.rec.Owner == "") {
			l, exists, err := m.create(ctx, parent, id, raw, a, pending)
			if !exists {
				return l, err
			}
			continue // created meanwhile by another owner: judge it
		}
		held, left, err := m.judge(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("lease: acquire %v: %w", idText(id), err)
		}
		if held || try >= maxClaimAttempts {
			m.heldBy(ctx, id, s.rec, left)
			return nil, &HeldError{ID: id, Owner: s.rec.Owner, Epoch: s.rec.Epoch, ExpiresAt: s.rec.ExpiresAt, TimeLeft: left}
		}
		// Released or expired since the claim was judged: claim again.
	}
}

// settle reports whether the record s shows one of the pending claims (whose
// outcome was unknown) applied: the lease is then ours, from that claim.
func (m *Manager) settle(ctx context.Context, parent context.Context, id any, raw docKey, s snapshot, pending *[]attempt) (*Lease, bool, error) {
	if pending == nil || !s.found || s.rec.Owner != m.c.owner {
		return nil, false, nil
	}
	for _, a := range *pending {
		if a.claim == s.rec.Claim {
			*pending = nil
			l, err := m.newLease(ctx, parent, id, raw, s.rec, a)
			return l, true, err
		}
	}
	return nil, false, nil
}

// judge reports whether the record s is a live lease, and how long it has
// left at most. In ModeServer the server's time read with s decides; in
// ModeEstimated the earliest the estimate allows.
func (m *Manager) judge(ctx context.Context, s snapshot) (held bool, left time.Duration, err error) {
	if !s.now.IsZero() {
		held = s.rec.Owner != "" && !s.rec.ExpiresAt.Before(s.now)
		return held, max(s.rec.ExpiresAt.Sub(s.now)+time.Millisecond, 0), nil
	}
	est, err := m.estimate(ctx)
	if err != nil {
		return false, 0, err
	}
	held = s.rec.Owner != "" && !s.rec.ExpiresAt.Before(cutoff(est))
	return held, max(s.rec.ExpiresAt.Sub(est.Earliest())+time.Millisecond, 0), nil
}

// claimOp returns the filter and update of a claim of an existing document:
// it matches a record with no owner, or an expired one, and sets the owner,
// the expiry, the claim id, and the next epoch.
func (m *Manager) claimOp(raw docKey, a attempt) (filter bson.D, update any) {
	filter = raw.Filter()
	if a.server {
		filter = append(filter, bson.E{Key: "$and", Value: bson.A{
			// A pipeline's $set would replace a lease field that is not a
			// document; leave such a document alone (read reports it).
			bson.D{{Key: "$or", Value: bson.A{
				bson.D{{Key: m.c.field, Value: bson.D{{Key: "$exists", Value: false}}}},
				bson.D{{Key: m.c.field, Value: bson.D{{Key: "$type", Value: bson.A{"object", "null"}}}}},
			}}},
			bson.D{{Key: "$or", Value: bson.A{
				bson.D{{Key: m.pOwner, Value: nil}},
				bson.D{{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{"$" + m.pExpires, "$$NOW"}}}}},
			}}},
		}})
		return filter, m.serverClaim(a, m.nextEpoch())
	}
	// $inc would start a record without an epoch at 1: such a record gets
	// its first epoch from create instead.
	filter = append(filter,
		bson.E{Key: m.pEpoch, Value: existsTrue},
		bson.E{Key: "$or", Value: bson.RawValue{Type: bson.TypeArray, Value: m.freeOrExpired(cutoff(a.est))}})
	return filter, m.estimatedUpdate(a)
}

// nextEpoch is the expression of a claim's epoch in ModeServer: the
// record's epoch + 1, or, for a record without one (a document leased for
// the first time, or deleted and inserted again; a new lock document), the
// server's time in microseconds + 1. Epochs of a document or name thus
// never repeat across its incarnations (see DESIGN.md).
func (m *Manager) nextEpoch() bson.D {
	micros := bson.D{{Key: "$multiply", Value: bson.A{bson.D{{Key: "$toLong", Value: "$$NOW"}}, int64(1000)}}}
	return bson.D{{Key: "$add", Value: bson.A{bson.D{{Key: "$ifNull", Value: bson.A{"$" + m.pEpoch, micros}}}, int64(1)}}}
}

// serverClaim is the update pipeline of a claim in ModeServer, with epoch as
// the new epoch's expression. Literals are wrapped in $literal: an owner
// string that starts with "$" must not read as a field path.
func (m *Manager) serverClaim(a attempt, epoch any) mongo.Pipeline {
	return mongo.Pipeline{{{Key: "$set", Value: bson.D{
		{Key: m.pOwner, Value: bson.D{{Key: "$literal", Value: m.c.owner}}},
		{Key: m.pExpires, Value: bson.D{{Key: "$add", Value: bson.A{"$$NOW", m.c.ttl.Milliseconds()}}}},
		{Key: m.pAcquired, Value: "$$NOW"},
		{Key: m.pRenewed, Value: "$$NOW"},
		{Key: m.pClaim, Value: bson.D{{Key: "$literal", Value: a.claim}}},
		{Key: m.pEpoch, Value: epoch},
	}}}}
}

// estimatedClaim is the $set of a claim in ModeEstimated.
func (m *Manager) estimatedClaim(a attempt) bson.D {
	expires, acquired := m.estimatedTimes(a)
	return bson.D{
		{Key: m.pOwner, Value: m.c.owner},
		{Key: m.pExpires, Value: expires},
		{Key: m.pAcquired, Value: acquired},
		{Key: m.pClaim, Value: a.claim},
	}
}

// estimatedTimes are the expiry and acquisition time of a claim a made from
// the Clock's estimate.
func (m *Manager) estimatedTimes(a attempt) (expires, acquired time.Time) {
	return a.est.Time.Add(m.c.ttl).Truncate(time.Millisecond), a.est.Time.Truncate(time.Millisecond)
}

// create makes the first claim of a record without an epoch. For a named
// lease it makes the lock document: an upsert whose filter matches only a
// document without an epoch, so that it inserts, or fails on the duplicate
// _id when another owner's claim made the document first. For a document
// lease (ModeEstimated, where a claim's $inc would start the epoch at 1) it
// is an update of the existing document on the same filter. The first epoch
// is the server's time in microseconds (see DESIGN.md: the epoch never goes
// backwards even when a document was deleted and inserted again, or
// clean-up deleted an earlier lock document of the same name). It reports
// exists when the record has an epoch after all (another owner's claim):
// the caller judges it.
func (m *Manager) create(ctx context.Context, parent context.Context, id any, raw docKey, a attempt, pending *[]attempt) (l *Lease, exists bool, err error) {
	a.claim, a.t0 = bson.NewObjectID(), m.c.now()
	filter := append(raw.Filter(), bson.E{Key: m.pEpoch, Value: bson.D{{Key: "$exists", Value: false}}})
	var update any
	if a.server {
		update = m.serverClaim(a, m.nextEpoch())
	} else {
		var err error
		if a.est, err = m.estimate(ctx); err != nil {
			return nil, false, fmt.Errorf("lease: acquire %v: %w", idText(id), err)
		}
		set := append(m.estimatedClaim(a), bson.E{Key: m.pEpoch, Value: a.est.Latest().UnixMicro() + 1})
		update = bson.D{{Key: "$set", Value: set}}
	}
	opts := m.createOpts
	if !m.named {
		opts = m.claimOptsNP // the document exists: never insert one
	}
	l, _, done, err := m.send(ctx, parent, id, raw, a, pending, func(ctx context.Context) (bson.Raw, error) {
		return m.coll.FindOneAndUpdate(ctx, filter, update, opts).Raw()
	})
	switch {
	case done:
		return l, false, err
	case err == nil:
		return nil, true, nil // pending, as in claim: judge the record
	case errors.Is(err, ErrUnknownOutcome):
		return nil, false, err
	}
	// A duplicate key (however the server reports it: DocumentDB answers
	// InternalError inside findAndModify) or another refusal: if the
	// document exists now, another owner made it; judge it.
	s, rerr := m.read(ctx, raw, a.server)
	if rerr == nil && s.found {
		return nil, true, nil
	}
	return nil, false, fmt.Errorf("lease: acquire %v: create the lock document: %w", idText(id), err)
}

// send sends the claim a through the settling engine (internal/settle): a
// record read back after an ambiguous failure that shows a's claim id means
// applied; any other, not yet (Live), but never sent again as it is (a try
// takes a fresh claim id): it is pending, as is one left unknown, for a
// later read to settle. done reports a applied, with its Lease or error;
// otherwise s is the record read back (err nil), or err the failure.
func (m *Manager) send(ctx context.Context, parent context.Context, id any, raw docKey, a attempt, pending *[]attempt, send func(context.Context) (bson.Raw, error)) (l *Lease, s snapshot, done bool, err error) {
	res, err := settle.Exec(ctx, m.settling(ctx, opAcquire, id), settle.Write[bson.Raw, snapshot]{
		Send: func(ctx context.Context) (bson.Raw, bool, error) {
			doc, err := send(ctx)
			return doc, err == nil, err
		},
		Read: m.reader(raw, a.server),
		Judge: func(s snapshot) (settle.Verdict, string) {
			if s.found && s.rec.Owner == m.c.owner && s.rec.Claim == a.claim {
				return settle.Landed, ""
			}
			return settle.Live, ""
		},
		Unknown: func(_ snapshot, _ bool, reason string, err error) error {
			return &UnknownOutcomeError{Pkg: "lease", Op: "acquire", ID: id, Reason: reason, Err: err}
		},
	})
	switch {
	case res.Applied && res.HasReply:
		l, err = m.claimed(ctx, parent, id, raw, res.Reply, a)
		return l, s, true, err
	case res.Applied:
		l, err = m.newLease(ctx, parent, id, raw, res.Read.rec, a)
		return l, s, true, err
	case pending != nil && (res.HasRead || errors.Is(err, ErrUnknownOutcome)):
		*pending = append(*pending, a)
	}
	return nil, res.Read, false, err
}

// claimed makes the Lease from the document a claim returned.
func (m *Manager) claimed(ctx context.Context, parent context.Context, id any, raw docKey, doc bson.Raw, a attempt) (*Lease, error) {
	rec, err := m.decode(doc)
	if err != nil {
		return nil, err
	}
	if rec.Owner != m.c.owner || rec.Claim != a.claim {
		return nil, fmt.Errorf("lease: acquire %v: the server returned a record that is not this claim (owner %q)", idText(id), rec.Owner)
	}
	return m.newLease(ctx, parent, id, raw, rec, a)
}

// codeNotImplemented is the error code of a command option the server does
// not implement (FerretDB v1 answers it for findAndModify's projection).
const codeNotImplemented = 238

// findAndModify sends a claim, with a projection to the lease field unless
// the server has rejected that once: the claim is then not applied, and is
// sent again without it.
func (m *Manager) findAndModify(ctx context.Context, filter bson.D, update any) (bson.Raw, error) {
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

// newLease makes the Lease for a claim of rec made by attempt a. If the
// claim's reply came too late for any of the lease to be usable, or ctx
// ended meanwhile, it releases the claim and fails.
func (m *Manager) newLease(ctx context.Context, parent context.Context, id any, raw docKey, rec record, a attempt) (*Lease, error) {
	recv := m.c.now()
	deadline := m.deadline(a, rec.ExpiresAt)
	l := &Lease{
		m:          m,
		id:         id,
		raw:        raw,
		server:     a.server,
		epoch:      rec.Epoch,
		claim:      rec.Claim,
		acquiredAt: rec.AcquiredAt,
		sentAt:     a.t0,
		expiresAt:  rec.ExpiresAt,
		lastSent:   rec.ExpiresAt,
		deadline:   deadline,
	}
	if a.server {
		l.fenceUntil = m.fenceUntil(rec.RenewedAt, deadline, recv)
	}
	l.ctx, l.cancel = context.WithCancelCause(parent)
	left := l.deadline.Sub(recv)
	var fail error
	switch {
	case ctx.Err() != nil:
		fail = fmt.Errorf("lease: acquire %v: %w", idText(id), store.ContextError(ctx))
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

// deadline is the local time (on Options.Now) at which the holder must have
// stopped, for a claim or renewal a that was applied and wrote expires (see
// DESIGN.md for the derivations).
//
// ModeServer: the server set expiresAt = $$NOW + TTL at some instant after
// a.t0, and nobody sees the lease expired before its clock passes that, which
// takes at least TTL×(1−DriftRate) of local time: deadline = t0 + TTL −
// TTL×DriftRate − SafetyMargin.
//
// ModeEstimated: at t0 the server's clock read at most est.Latest(), so it
// reaches expires no sooner than (expires − est.Latest())×(1 − DriftRate)
// after t0. The result is clamped to t0 + TTL − TTL×DriftRate −
// SafetyMargin, so that no estimate, however wrong, gives a holder more than
// the TTL it asked for.
func (m *Manager) deadline(a attempt, expires time.Time) time.Time {
	drift := time.Duration(float64(m.c.ttl) * m.c.drift)
	ceiling := a.t0.Add(m.c.ttl - drift - m.c.margin)
	if a.server {
		return ceiling
	}
	d := a.t0.Add(expires.Sub(a.est.Latest()) - drift - m.c.margin)
	if d.After(ceiling) {
		return ceiling
	}
	return d
}

// fenceUntil is the server time from which a fenced write must fail
// (ModeServer): no earlier than the server's clock reads when the local
// deadline passes. The write that set stamp (the server's $$NOW) was
// executed before recv, so at local time deadline the server's clock reads
// at least stamp + (deadline − recv)×(1 − DriftRate).
func (m *Manager) fenceUntil(stamp, deadline, recv time.Time) time.Time {
	drift := time.Duration(float64(m.c.ttl) * m.c.drift)
	return stamp.Add(deadline.Sub(recv) - drift).Truncate(time.Millisecond)
}

package lease

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/store"
)

// attempt is one claim or renewal sent: its id, the local time before it
// was sent, and (in ModeEstimated) the estimate it was computed from.
type attempt struct {
	claim  bson.ObjectID
	t0     time.Time
	est    store.Estimate
	server bool
}

// waiting is what one Acquire call carries from attempt to attempt.
type waiting struct {
	pending []attempt  // claims whose outcome is unknown: a record showing one is ours
	held    *HeldError // the holder the last read found
	due     time.Time  // local time (Options.Now) at which its time is up
}

// maxClaimAttempts bounds how often one TryAcquire claims again after finding
// the lease free or expired on re-reading, under heavy churn.
const maxClaimAttempts = 3

// firstEpochFloor: an epoch below it (2^50 µs is in 2005) is not from the
// server's clock; its holder is giving it its first (firstEpoch).
const firstEpochFloor = 1 << 50

// estimate returns the Clock's estimate, refusing one that cannot be used
// (the zero Estimate, a negative bound) as if the Clock had none.
func (m *Manager) estimate(ctx context.Context) (store.Estimate, error) {
	est, err := m.c.Clock.Now(ctx)
	if err != nil {
		return est, err
	}
	if est.Time.IsZero() || est.Bound < 0 || est.Time.Year() < 1971 {
		return store.Estimate{}, fmt.Errorf("%w: the clock gave an unusable estimate (%v ± %v)", store.ErrNoServerTime, est.Time, est.Bound)
	}
	return est, nil
}

// claim is TryAcquire without the argument checks. parent is the parent of
// the lease's context; w, when not nil, is the state of an Acquire call.
func (m *Manager) claim(ctx context.Context, id any, raw docKey, parent context.Context, w *waiting) (*Lease, error) {
	ctx = store.NoSession(ctx)
	fail := func(err error) error { return fmt.Errorf("lease: acquire %v: %w", idText(id), err) }
	server, err := m.serverMode(ctx)
	if err != nil {
		return nil, fail(err)
	}
	absent := false // a lock document to make, in ModeServer
	for try := 1; ; try++ {
		a := attempt{claim: bson.NewObjectID(), t0: m.c.Now(), server: server}
		if !server {
			if a.est, err = m.estimate(ctx); err != nil {
				return nil, fail(err)
			}
		}
		filter, update := m.claimOp(raw, a)
		upsert := m.named && !server
		if absent {
			// An upsert may not carry $expr: match only a record without an
			// epoch, so that it inserts, or fails on the duplicate _id.
			filter, upsert = append(raw.Filter(), bson.E{Key: m.pEpoch, Value: bson.D{{Key: "$exists", Value: false}}}), true
		}
		l, s, done, err := m.send(ctx, parent, id, raw, a, w, false, func(ctx context.Context) (bson.Raw, error) {
			return m.findAndModify(ctx, filter, update, upsert)
		})
		switch {
		case done:
			return l, err
		case err == nil:
			// Not applied as far as a majority knows: pending (see send).
			if cerr := store.ContextError(ctx); cerr != nil {
				return nil, fail(cerr)
			}
		case errors.Is(err, ErrUnknownOutcome):
			return nil, err
		default:
			// Not applied: nothing matched, or a lock document exists (the
			// upsert's duplicate _id), or DocumentDB refused $$NOW on a
			// collection not made yet.
			noMatch := errors.Is(err, mongo.ErrNoDocuments) || store.IsDuplicateKey(err)
			if now := m.c.Now(); noMatch && w != nil && w.held != nil && now.Before(w.due) {
				h := *w.held // nothing new before the holder's time is up
				h.TimeLeft = w.due.Sub(now)
				return nil, &h
			}
			var rerr error
			switch s, rerr = m.read(ctx, raw, server); {
			case rerr != nil && errors.Is(err, mongo.ErrNoDocuments):
				return nil, fail(fmt.Errorf("read after a failed claim: %w", rerr))
			case rerr != nil || (s.found && !noMatch && try >= maxClaimAttempts):
				return nil, fail(err)
			case !s.found && m.named && try >= maxClaimAttempts:
				return nil, fail(fmt.Errorf("create the lock document: %w", err))
			}
		}
		if l, ok, err := m.pendingLanded(ctx, parent, id, raw, s, w); ok || err != nil {
			return l, err
		}
		if !s.found {
			if !m.named {
				return nil, fail(ErrNotFound)
			}
			absent = server
			continue
		}
		absent = false
		held, left, err := m.judge(ctx, s)
		if err != nil {
			return nil, fail(err)
		}
		if s.rec.Epoch < firstEpochFloor && s.rec.First >= firstEpochFloor {
			s.rec.Epoch = s.rec.First // the epoch the holder's Lease has
		}
		if held || try >= maxClaimAttempts {
			m.heldBy(ctx, id, s.rec, left)
			h := &HeldError{ID: id, Owner: s.rec.Owner, Epoch: s.rec.Epoch, ExpiresAt: s.rec.ExpiresAt, TimeLeft: left}
			if w != nil {
				// Wake no earlier than the holder's expiry, drift included.
				w.held, w.due = h, m.c.Now().Add(left+time.Duration(float64(left)*m.c.DriftRate)+time.Millisecond)
			}
			return nil, h
		}
		// Released or expired since the claim was judged: claim again.
	}
}

// pendingLanded reports whether the record s shows one of the pending claims (whose
// outcome was unknown) applied: the lease is then ours, from that claim.
func (m *Manager) pendingLanded(ctx context.Context, parent context.Context, id any, raw docKey, s snapshot, w *waiting) (*Lease, bool, error) {
	if w == nil || !s.found || s.rec.Owner != m.c.Owner {
		return nil, false, nil
	}
	for _, a := range w.pending {
		if a.claim == s.rec.Claim {
			w.pending = nil
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
	now := s.now
	if now.IsZero() {
		est, err := m.estimate(ctx)
		if err != nil {
			return false, 0, err
		}
		now = cutoff(est)
	}
	held = s.rec.Owner != "" && !s.rec.ExpiresAt.Before(now)
	return held, max(s.rec.ExpiresAt.Sub(now)+time.Millisecond, 0), nil
}

// claimOp returns the filter and update of a claim: it matches a record with
// no owner (or none at all), or an expired one, and sets the owner, the
// expiry, the claim id, and the next epoch.
func (m *Manager) claimOp(raw docKey, a attempt) (filter bson.D, update any) {
	filter = raw.Filter()
	if !a.server {
		t := m.estimated // $inc starts a missing epoch at 1: see firstEpoch
		or, update := bytes.Clone(t.or), bytes.Clone(t.update)
		putDate(or, t.cutoff, cutoff(a.est))
		putDate(update, t.expires, a.est.Time.Add(m.c.TTL))
		putDate(update, t.acquired, a.est.Time)
		copy(update[t.claim:], a.claim[:])
		binary.LittleEndian.PutUint64(update[t.first:], uint64(a.est.Latest().UnixMicro()+1))
		return append(filter, bson.E{Key: "$or", Value: bson.RawValue{Type: bson.TypeArray, Value: or}}), bson.Raw(update)
	}
	filter = append(filter, bson.E{Key: "$and", Value: bson.A{
		// A pipeline's $set would replace a lease field that is not a
		// document; leave such a document alone (read reports it).
		bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: m.c.Field, Value: bson.D{{Key: "$exists", Value: false}}}},
			bson.D{{Key: m.c.Field, Value: bson.D{{Key: "$type", Value: bson.A{"object", "null"}}}}},
		}}},
		bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: m.pOwner, Value: nil}},
			bson.D{{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{"$" + m.pExpires, "$$NOW"}}}}},
		}}},
	}})
	// The epoch: the record's + 1, or the server's time in µs + 1 (see
	// DESIGN.md). $literal: an owner starting with "$" is no field path.
	micros := bson.D{{Key: "$multiply", Value: bson.A{bson.D{{Key: "$toLong", Value: "$$NOW"}}, int64(1000)}}}
	return filter, mongo.Pipeline{{{Key: "$set", Value: bson.D{
		{Key: m.pOwner, Value: bson.D{{Key: "$literal", Value: m.c.Owner}}},
		{Key: m.pExpires, Value: bson.D{{Key: "$add", Value: bson.A{"$$NOW", m.c.TTL.Milliseconds()}}}},
		{Key: m.pAcquired, Value: "$$NOW"},
		{Key: m.pRenewed, Value: "$$NOW"},
		{Key: m.pClaim, Value: bson.D{{Key: "$literal", Value: a.claim}}},
		{Key: m.pEpoch, Value: bson.D{{Key: "$add", Value: bson.A{bson.D{{Key: "$ifNull", Value: bson.A{"$" + m.pEpoch, micros}}}, int64(1)}}}},
	}}}}
}

// template is a claim in ModeEstimated (claimOp's $or and update),
// marshalled once per Manager with placeholders, and the offsets of the
// values each claim writes into its copy of the bytes.
type template struct {
	or, update                              []byte
	cutoff, expires, acquired, claim, first int
}

func newTemplate(m *Manager) template {
	const c, e, a, f = 0x6c_6561_7365_0001, 0x6c_6561_7365_0002, 0x6c_6561_7365_0003, 0x6c_6561_7365_0004
	id := bson.ObjectID([]byte("\x00lease.claim"))
	or, _ := bson.Marshal(bson.D{
		{Key: "0", Value: bson.D{{Key: m.pOwner, Value: nil}}},
		{Key: "1", Value: bson.D{{Key: m.pExpires, Value: bson.D{{Key: "$lt", Value: bson.DateTime(c)}}}}},
	})
	update, _ := bson.Marshal(bson.D{
		{Key: "$set", Value: bson.D{
			{Key: m.pOwner, Value: m.c.Owner},
			{Key: m.pExpires, Value: bson.DateTime(e)},
			{Key: m.pAcquired, Value: bson.DateTime(a)},
			{Key: m.pClaim, Value: id},
			{Key: m.pFirst, Value: int64(f)},
		}},
		{Key: "$inc", Value: bson.D{{Key: m.pEpoch, Value: int64(1)}}},
	})
	// The last match: only the owner, before them, may hold the same bytes
	// (field names hold no NUL byte).
	at := func(b []byte, v uint64) int { return bytes.LastIndex(b, binary.LittleEndian.AppendUint64(nil, v)) }
	return template{or: or, update: update, cutoff: at(or, c), expires: at(update, e), acquired: at(update, a), claim: bytes.LastIndex(update, id[:]), first: at(update, f)}
}

// putDate writes t at b[i:] as a BSON date: milliseconds, truncated, as
// the driver stores a time.Time.
func putDate(b []byte, i int, t time.Time) {
	binary.LittleEndian.PutUint64(b[i:], uint64(t.UnixMilli()))
}

// send sends the claim a (send returns the record's document, nil when a
// copy did not apply) through the settling engine. A record read back that
// shows a's claim id means applied; no record, not yet (Live: sent again if
// resend); another, not applied. One that did not land, or left unknown, is
// pending in w for a later read to settle. done reports a applied, with its
// Lease or error; otherwise s is the record read back, or err the failure.
func (m *Manager) send(ctx context.Context, parent context.Context, id any, raw docKey, a attempt, w *waiting, resend bool, send func(context.Context) (bson.Raw, error)) (l *Lease, s snapshot, done bool, err error) {
	res, err := settle.Exec(ctx, m.settling(ctx, opAcquire, id), settle.Write[bson.Raw, snapshot]{
		Send: func(ctx context.Context) (bson.Raw, bool, error) {
			doc, err := send(ctx)
			return doc, err == nil && doc != nil, err
		},
		Read: m.reader(raw, a.server),
		Judge: func(s snapshot) (settle.Verdict, string) {
			switch {
			case s.found && s.rec.Owner == m.c.Owner && s.rec.Claim == a.claim:
				return settle.Landed, ""
			case s.found:
				return settle.Dead, ""
			}
			return settle.Live, ""
		},
		Resend:  resend,
		Unknown: unknown[snapshot](opAcquire, id),
	})
	switch {
	case res.Applied && res.HasReply:
		rec, err := m.decode(res.Reply)
		if err == nil && (rec.Owner != m.c.Owner || rec.Claim != a.claim) {
			err = fmt.Errorf("lease: acquire %v: the server returned a record that is not this claim (owner %q)", idText(id), rec.Owner)
		}
		if err != nil {
			return nil, s, true, err
		}
		l, err = m.newLease(ctx, parent, id, raw, rec, a)
		return l, s, true, err
	case res.Applied:
		l, err = m.newLease(ctx, parent, id, raw, res.Read.rec, a)
		return l, s, true, err
	case w != nil && (res.HasRead || errors.Is(err, ErrUnknownOutcome)):
		w.pending = append(w.pending, a)
	}
	return nil, res.Read, false, err
}

// unknown makes the settling engine's error for a write of op on id that it
// could not settle.
func unknown[S any](op string, id any) func(S, bool, string, error) error {
	return func(_ S, _ bool, reason string, err error) error {
		return &UnknownOutcomeError{Pkg: "lease", Op: op, ID: id, Reason: reason, Err: err}
	}
}

// codeNotImplemented is the error code of a command option the server does
// not implement (FerretDB v1 answers it for findAndModify's projection).
const codeNotImplemented = 238

// findAndModify sends a claim or renewal, asking for the lease field alone
// on a leased document unless the server has rejected that projection once
// (the write then did not apply, and is sent again without it).
func (m *Manager) findAndModify(ctx context.Context, filter bson.D, update any, upsert bool) (bson.Raw, error) {
	if upsert {
		return m.coll.FindOneAndUpdate(ctx, filter, update, m.upsertOpts).Raw()
	}
	if !m.named && !m.noProject.Load() {
		raw, err := m.coll.FindOneAndUpdate(ctx, filter, update, m.claimOpts).Raw()
		var se mongo.ServerError
		if !errors.As(err, &se) || !se.HasErrorCode(codeNotImplemented) {
			return raw, err
		}
		m.noProject.Store(true)
	}
	return m.coll.FindOneAndUpdate(ctx, filter, update, m.claimOptsNP).Raw()
}

// newLease makes the Lease for a claim of rec made by attempt a (see
// firstEpoch). If ctx ended or the claim's deadline passed meanwhile, it
// releases the claim and fails.
func (m *Manager) newLease(ctx context.Context, parent context.Context, id any, raw docKey, rec record, a attempt) (*Lease, error) {
	recv := m.c.Now()
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
	var fail error
	if l.epoch < firstEpochFloor && !a.server {
		fail = l.firstEpoch(ctx, rec.First)
	}
	left := l.deadline.Sub(m.c.Now())
	switch {
	case fail != nil:
	case ctx.Err() != nil:
		fail = fmt.Errorf("lease: acquire %v: %w", idText(id), store.ContextError(ctx))
	case left <= 0:
		fail = &LostError{ID: id, Owner: m.c.Owner, Epoch: l.epoch, Reason: Expired}
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

// firstEpoch gives the record l claimed without an epoch the "first" its
// claim wrote, in one update filtered on l's record, before l is handed out
// (see DESIGN.md, "The first epoch in ModeEstimated").
func (l *Lease) firstEpoch(ctx context.Context, epoch int64) error {
	m := l.m
	if epoch < firstEpochFloor {
		return fmt.Errorf("lease: acquire %v: the claim wrote no first epoch (%d)", idText(l.id), epoch)
	}
	filter := l.filter()
	update := bson.D{{Key: "$set", Value: bson.D{{Key: m.pEpoch, Value: epoch}}}}
	res, err := settle.Exec(ctx, m.settling(ctx, opAcquire, l.id), settle.Write[struct{}, snapshot]{
		Send: func(ctx context.Context) (struct{}, bool, error) {
			res, err := m.coll.UpdateOne(ctx, filter, update)
			return struct{}{}, err == nil && res.MatchedCount == 1, err
		},
		Read: m.reader(l.raw, false),
		Judge: func(s snapshot) (settle.Verdict, string) {
			switch {
			case l.ours(s.rec, s.found):
				return settle.Live, ""
			case s.found && s.rec.Owner == m.c.Owner && s.rec.Claim == l.claim && s.rec.Epoch == epoch:
				return settle.Landed, ""
			}
			return settle.Dead, ""
		},
		Resend:  true, // filtered on the old epoch: one copy applies
		Unknown: unknown[snapshot](opAcquire, l.id),
	})
	switch {
	case errors.Is(err, ErrUnknownOutcome):
		return err
	case err != nil:
		return fmt.Errorf("lease: acquire %v: %w", idText(l.id), err)
	case !res.Applied:
		return l.lost(Cleared, res.Read.rec)
	}
	l.epoch = epoch
	return nil
}

// deadline is the local time at which the holder must have stopped, for a
// claim or renewal a that applied and wrote expires (see DESIGN.md, "The
// holder's deadline").
func (m *Manager) deadline(a attempt, expires time.Time) time.Time {
	drift := time.Duration(float64(m.c.TTL) * m.c.DriftRate)
	d := a.t0.Add(m.c.TTL - drift - m.c.SafetyMargin)
	if a.server {
		return d
	}
	if e := a.t0.Add(expires.Sub(a.est.Latest()) - drift - m.c.SafetyMargin); e.Before(d) {
		return e
	}
	return d
}

// fenceUntil is the server time from which a fenced write must fail
// (ModeServer), for a write of $$NOW stamp whose reply came at recv.
func (m *Manager) fenceUntil(stamp, deadline, recv time.Time) time.Time {
	drift := time.Duration(float64(m.c.TTL) * m.c.DriftRate)
	return stamp.Add(deadline.Sub(recv) - drift).Truncate(time.Millisecond)
}

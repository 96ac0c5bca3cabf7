package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/store"
)

// Lease is a claim on one document or name, held by its Manager's owner until
// it is released, lost, or expires. Its epoch is a fencing token: add Fence
// to the writes made under the lease, so that they fail once the
// lease was taken over. A Lease is safe for concurrent use.
type Lease struct {
	m      *Manager
	id     any
	raw    docKey // id's encoding, checked by store.CheckID, and shard-key values
	server bool   // claimed in ModeServer
	epoch  int64
	claim  bson.ObjectID // the id of the claim that made it: in every filter on the record

	acquiredAt time.Time
	sentAt     time.Time // local time (Options.Now) the claim was sent, for observers

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu         sync.Mutex
	expiresAt  time.Time   // server time, as last confirmed
	lastSent   time.Time   // the largest expiry ever sent: renewals only move it forward
	deadline   time.Time   // local time (Options.Now) at which the holder stops
	fenceUntil time.Time   // ModeServer: the server time from which Fence fails
	timer      *time.Timer // fires at deadline
	err        error       // nil while held; ErrReleased or a *LostError after
}

// ID returns the _id of the leased document, or the name of a named lease.
func (l *Lease) ID() any { return l.id }

// Owner returns the owner string written in the lease record.
func (l *Lease) Owner() string { return l.m.c.Owner }

// Epoch returns the lease's fencing token: the record's epoch after this
// claim. Every claim of the same document or name, by any owner, gets a
// larger one, even after the document was deleted and inserted again: the
// first claim of a record takes the server's time in microseconds + 1, so
// epochs are large numbers (see DESIGN.md).
func (l *Lease) Epoch() int64 { return l.epoch }

// AcquiredAt returns when the lease was claimed, on the server's clock (as
// estimated by the claimer).
func (l *Lease) AcquiredAt() time.Time { return l.acquiredAt }

// ExpiresAt returns the expiry written by the last claim or renewal known to
// have been applied, on the server's clock.
func (l *Lease) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiresAt
}

// Deadline returns the local time, on Options.Now's clock, at which the
// holder must have stopped working under the lease unless it renews it. The
// lease's context ends then.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// TimeLeft returns the time until Deadline, or 0 once it has passed or the
// lease has ended.
func (l *Lease) TimeLeft() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return 0
	}
	return max(l.deadline.Sub(l.m.c.Now()), 0)
}

// Context returns a context that ends when the lease is released or lost,
// whichever comes first, or when its parent ends (the context given to Do;
// TryAcquire and Acquire keep only their context's values). Its
// context.Cause is ErrReleased or a *LostError.
func (l *Lease) Context() context.Context { return l.ctx }

// Done returns a channel that is closed when the lease's context ends.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lease is held, ErrReleased after Release, and a
// *LostError (matching ErrLost) once it was lost.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Fence returns the filter conditions that match the protected document only
// while this lease holds it. Add them to the filter of every write made under
// the lease (with the versioned package, as versioned.WhereErr(l.Fence(),
// lease.ErrLost)); a fenced write that matches nothing was made by a holder
// that had lost the lease, and changed nothing. Call Fence for each write:
// once the Lease knows it was released or lost (Err is not nil) it returns
// a condition that matches nothing ({<key>: {$in: []}}).
//
// For a document lease the conditions are {<Field>.owner: owner,
// <Field>.epoch: epoch, <Field>.claim: the claim id of this Lease}: they fail
// once anyone else claimed the lease, or this one released it. For a named
// lease the condition is {<FenceField>.<name>: epoch}, on the documents
// stamped with [Lease.Stamp]: it fails on a document once a later holder of
// the name stamped it (Release changes no stamp; see the package's
// Guarantees). In ModeServer the conditions also hold {$expr: {$lt:
// ["$$NOW", t]}}, where t is the server's time at the holder's local
// deadline at the earliest, so a fenced write sent after the lease expired
// locally fails even if nobody has claimed it since; in ModeEstimated such a
// write applies until the record changes, ordered before every write of a
// later holder (see DESIGN.md).
func (l *Lease) Fence() bson.D {
	key := l.m.pOwner
	if l.m.named {
		key = l.fencePath()
	}
	l.mu.Lock()
	ended, until := l.err != nil, l.fenceUntil
	l.mu.Unlock()
	if ended {
		// Match nothing ($in [] works on every backend), on the fence's key.
		return bson.D{{Key: key, Value: bson.D{{Key: "$in", Value: bson.A{}}}}}
	}
	var d bson.D
	if l.m.named {
		d = bson.D{{Key: key, Value: l.epoch}}
	} else {
		d = bson.D{
			{Key: key, Value: l.m.c.Owner},
			{Key: l.m.pEpoch, Value: l.epoch},
			{Key: l.m.pClaim, Value: l.claim},
		}
	}
	if l.server {
		d = append(d, bson.E{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{"$$NOW", until}}}})
	}
	return d
}

// String describes the lease for logs.
func (l *Lease) String() string {
	return fmt.Sprintf("lease %s owner %q epoch %d", idText(l.id), l.m.c.Owner, l.epoch)
}

// finish ends the lease with err unless it has ended already, and returns the
// error it ended with.
func (l *Lease) finish(err error) error {
	l.mu.Lock()
	if prior := l.err; prior != nil {
		l.mu.Unlock()
		return prior
	}
	l.err = err
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	l.ended(err)
	l.cancel(err)
	l.m.lines.ended(lineID(l.raw), l)
	return err
}

// onDeadline runs when the deadline timer fires: it ends the lease as expired
// unless a renewal moved the deadline meanwhile.
func (l *Lease) onDeadline() {
	l.mu.Lock()
	left := l.deadline.Sub(l.m.c.Now())
	if l.err == nil && left > 0 {
		l.timer.Reset(left)
	}
	l.mu.Unlock()
	if left <= 0 {
		_ = l.finish(l.lost(Expired, record{})) // nothing if it ended already
	}
}

func (l *Lease) lost(reason Reason, now record) *LostError {
	return &LostError{ID: l.id, Owner: l.m.c.Owner, Epoch: l.epoch, Reason: reason, Holder: now.Owner, HolderEpoch: now.Epoch}
}

// lostFrom returns the LostError that the record r (or its absence) shows.
func (l *Lease) lostFrom(r record, found bool) *LostError {
	if !found || (r.Owner == "" && r.Epoch == l.epoch) {
		return l.lost(Cleared, r)
	}
	return l.lost(TakenOver, r)
}

// ours reports whether r is this lease's record.
func (l *Lease) ours(r record, found bool) bool {
	return found && r.Owner == l.m.c.Owner && r.Epoch == l.epoch && r.Claim == l.claim
}

// filter matches the record while it is this lease's: _id, owner, epoch and
// claim id.
func (l *Lease) filter() bson.D {
	return append(l.raw.Filter(),
		bson.E{Key: l.m.pOwner, Value: l.m.c.Owner},
		bson.E{Key: l.m.pEpoch, Value: l.epoch},
		bson.E{Key: l.m.pClaim, Value: l.claim},
	)
}

// Renew extends the lease to TTL from now. On success it moves the local
// deadline and the lease's context lives on. It returns a *LostError, and
// ends the lease, when the record shows another owner or epoch or the local
// deadline has passed; ErrReleased after Release; other errors (network,
// timeouts) leave the lease held until its deadline. After an ambiguous
// failure it re-reads the record to learn whether the renewal was applied.
// A session in ctx is not used.
//
// A renewal is one write filtered on the lease's record. In ModeServer it
// sets expiresAt to the larger of itself and $$NOW + TTL; in ModeEstimated
// to the estimate + TTL, filtered on an earlier expiry. Either way a delayed
// renewal never moves the expiry back.
func (l *Lease) Renew(ctx context.Context) (err error) {
	if err := store.CheckContext(ctx); err != nil {
		return fmt.Errorf("lease: renew %s: %w", idText(l.id), err)
	}
	ctx, ob := l.m.begin(ctx, opRenew, l.id)
	defer l.endRenew(&ob, &err)
	ctx = store.NoSession(ctx)
	if err := l.Err(); err != nil {
		return err
	}
	if l.TimeLeft() <= 0 {
		return l.finish(l.lost(Expired, record{}))
	}
	m := l.m
	a := attempt{claim: bson.NewObjectID(), t0: m.c.Now(), server: l.server}
	filter, expires := l.filter(), time.Time{}
	var update any
	if l.server {
		newExpiry := bson.D{{Key: "$add", Value: bson.A{"$$NOW", m.c.TTL.Milliseconds()}}}
		set := bson.D{
			{Key: m.pExpires, Value: bson.D{{Key: "$max", Value: bson.A{"$" + m.pExpires, newExpiry}}}},
			{Key: m.pRenewed, Value: "$$NOW"},
			{Key: m.pRenewal, Value: bson.D{{Key: "$literal", Value: a.claim}}},
		}
		if m.c.Retain != "" {
			// Retain moves with the renewal, in the same write; $max keeps a
			// later time the document's own writes put there.
			until := bson.D{{Key: "$add", Value: bson.A{"$$NOW", m.c.RetainFor.Milliseconds()}}}
			set = append(set, bson.E{Key: m.c.Retain, Value: bson.D{{Key: "$max", Value: bson.A{"$" + m.c.Retain, until}}}})
		}
		update = mongo.Pipeline{{{Key: "$set", Value: set}}}
	} else {
		if a.est, err = m.estimate(ctx); err != nil {
			return fmt.Errorf("lease: renew %s: %w", idText(l.id), err)
		}
		expires = a.est.Time.Add(m.c.TTL).Truncate(time.Millisecond)
		l.mu.Lock()
		if !expires.After(l.lastSent) {
			expires = l.lastSent.Add(time.Millisecond)
		}
		l.lastSent = expires
		l.mu.Unlock()
		filter = append(filter, bson.E{Key: m.pExpires, Value: bson.D{{Key: "$lt", Value: expires}}})
		up := bson.D{{Key: "$set", Value: bson.D{{Key: m.pExpires, Value: expires}}}}
		if m.c.Retain != "" {
			up = append(up, bson.E{Key: "$max", Value: bson.D{{Key: m.c.Retain, Value: a.est.Time.Add(m.c.RetainFor).Truncate(time.Millisecond)}}})
		}
		update = up
	}
	// Never sent again: a renewal that did not show keeps the deadline,
	// which is safe whether or not it lands later.
	var last error // the last send's error
	res, err := settle.Exec(ctx, m.settling(ctx, opRenew, l.id), settle.Write[bson.Raw, snapshot]{
		Send: func(ctx context.Context) (doc bson.Raw, ok bool, err error) {
			if l.server {
				doc, err = m.findAndModify(ctx, filter, update, false)
				ok = err == nil
			} else {
				var res *mongo.UpdateResult
				res, err = m.coll.UpdateOne(ctx, filter, update)
				ok = err == nil && res.MatchedCount == 1
			}
			last = err
			return doc, ok, err
		},
		Read: m.reader(l.raw, l.server),
		Judge: func(s snapshot) (settle.Verdict, string) {
			switch {
			case !l.ours(s.rec, s.found):
				return settle.Dead, ""
			case l.server && s.rec.Renewal == a.claim, !l.server && s.rec.ExpiresAt.Equal(expires):
				return settle.Landed, ""
			}
			return settle.Live, ""
		},
		Unknown: unknown[snapshot](opRenew, l.id),
	})
	s := res.Read
	switch {
	case err == nil && res.Applied:
		if res.Reply != nil {
			if s.rec, err = m.decode(res.Reply); err != nil {
				return err
			}
		}
		if !l.server {
			s.rec = record{ExpiresAt: expires}
		}
		l.extend(s.rec, m.deadline(a, s.rec.ExpiresAt))
		return nil
	case err == nil && res.HasRead && l.ours(s.rec, s.found):
		return fmt.Errorf("lease: renew %s: not applied: %w", idText(l.id), last)
	case errors.Is(err, ErrUnknownOutcome):
		return err
	case err != nil && !errors.Is(err, mongo.ErrNoDocuments):
		return fmt.Errorf("lease: renew %s: %w", idText(l.id), err)
	}
	// Matched nothing, or read back no longer ours: the record tells.
	return l.notOurs(ctx, res.Read, res.HasRead, l.server, func(r record) error {
		// Ours, its expiry at or past the new one: nothing lost.
		return fmt.Errorf("lease: renew %s: expiry already at %v", idText(l.id), r.ExpiresAt)
	})
}

// notOurs ends the lease as lost for what the record s shows (read now
// unless has), and returns that *LostError even if the lease had ended
// meanwhile; ours, if the record is still this lease's, makes the error.
func (l *Lease) notOurs(ctx context.Context, s snapshot, has, server bool, ours func(record) error) error {
	var err error
	if !has {
		s, err = l.m.read(ctx, l.raw, server)
	}
	lost := l.lostFrom(s.rec, s.found)
	switch {
	case err != nil:
		lost = l.lost(Unread, record{})
		lost.Err = err
	case ours != nil && l.ours(s.rec, s.found):
		return ours(s.rec)
	}
	_ = l.finish(lost)
	return lost
}

// extend records a renewal that was applied and wrote rec.
func (l *Lease) extend(rec record, deadline time.Time) {
	recv := l.m.c.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	if rec.ExpiresAt.After(l.expiresAt) {
		l.expiresAt = rec.ExpiresAt
	}
	if l.server {
		if until := l.m.fenceUntil(rec.RenewedAt, deadline, recv); until.After(l.fenceUntil) {
			l.fenceUntil = until
		}
	}
	// Either deadline is safe: the expiry is at least the one it was for.
	if deadline.After(l.deadline) {
		l.deadline = deadline
		l.timer.Reset(max(deadline.Sub(l.m.c.Now()), 0))
	}
}

// Release gives the lease up with one updateOne filtered on _id, owner and
// epoch that clears the owner and the expiry (the epoch stays), and ends the
// lease's context with cause ErrReleased. It returns a *LostError (and
// changes nothing) when the lease was taken over or cleared by someone else,
// and ErrReleased when it was already released. A lease whose local deadline
// passed is still released if nobody took it over, so others need not wait
// for it; Release then returns its *LostError all the same, since the work
// done under it was not protected to the end. After an ambiguous failure
// Release re-reads the record and sends the update again (at most three
// times) while it was not applied; when that cannot settle it, it returns
// an *UnknownOutcomeError. A named lease's lock document keeps an expiry
// set to the server's time of release, for the clean-up. A session in ctx
// is not used.
func (l *Lease) Release(ctx context.Context) error { return l.release(ctx, nil) }

// ReleaseWith is Release of a document lease whose write also sets the
// fields of set in the leased document ({$set: set}): a last write under
// the lease and its release in one round trip. It is settled as Release is;
// set applies exactly when the release does. Before the lease's local
// deadline nobody else can clear it, so a nil error means set applied; a
// *LostError means it did not, except one with Reason Expired, which is
// returned whether or not the write applied (re-read the document to know).
// A named lease (its lock document is not the one it protects), or a field
// of set named "", starting with "$", or under "_id" or the lease field, is
// refused before anything is sent (ErrInvalid); the lease stays held.
func (l *Lease) ReleaseWith(ctx context.Context, set bson.D) error {
	err := l.m.checkFields(set)
	if l.m.named {
		err = fmt.Errorf("a named lease cannot set fields: %w", ErrInvalid)
	}
	if err != nil {
		return fmt.Errorf("lease: release %s: %w", idText(l.id), err)
	}
	return l.release(ctx, set)
}

func (l *Lease) release(ctx context.Context, set bson.D) (err error) {
	if err := store.CheckContext(ctx); err != nil {
		return fmt.Errorf("lease: release %s: %w", idText(l.id), err)
	}
	ctx, ob := l.m.begin(ctx, opRelease, l.id)
	defer l.m.end(&ob, &err)
	ctx = store.NoSession(ctx)
	m := l.m
	l.mu.Lock()
	prior := l.err
	expiredAt := l.deadline
	l.mu.Unlock()
	if prior == nil && !m.c.Now().Before(expiredAt) {
		prior = l.finish(l.lost(Expired, record{}))
	}
	var lost *LostError
	switch {
	case prior == nil:
	case errors.As(prior, &lost) && lost.Reason == Expired:
		// Expired locally: clear the record if it is still ours.
	default:
		return prior
	}

	fields := bson.D{{Key: "$unset", Value: bson.D{
		{Key: m.pOwner, Value: ""},
		{Key: m.pClaim, Value: ""},
		{Key: m.pExpires, Value: ""},
	}}}
	if set != nil {
		fields = append(fields, bson.E{Key: "$set", Value: set})
	}
	var update any = fields
	switch {
	case m.named && l.server:
		// Keep an expiry for the clean-up: the server's time of release.
		update = mongo.Pipeline{
			{{Key: "$set", Value: bson.D{{Key: m.pExpires, Value: "$$NOW"}}}},
			{{Key: "$unset", Value: bson.A{m.pOwner, m.pClaim}}},
		}
	case m.named:
		// The estimate of the server's time of release, or the lease's own
		// expiry if the clock cannot say.
		freed := l.ExpiresAt()
		if est, err := m.estimate(ctx); err == nil {
			freed = est.Time.Truncate(time.Millisecond)
		}
		update = bson.D{
			{Key: "$unset", Value: bson.D{{Key: m.pOwner, Value: ""}, {Key: m.pClaim, Value: ""}}},
			{Key: "$set", Value: bson.D{{Key: m.pExpires, Value: freed}}},
		}
	}
	var sent time.Time // when the last copy was sent
	res, err := settle.Exec(ctx, m.settling(ctx, opRelease, l.id), settle.Write[struct{}, snapshot]{
		Send: func(ctx context.Context) (struct{}, bool, error) {
			sent = m.c.Now()
			res, err := m.coll.UpdateOne(ctx, l.filter(), update)
			return struct{}{}, err == nil && res.MatchedCount == 1, err
		},
		Read: m.reader(l.raw, false),
		Judge: func(s snapshot) (settle.Verdict, string) {
			r, found := s.rec, s.found
			switch {
			case l.ours(r, found):
				return settle.Live, ""
			case found && r.Owner == "" && r.Epoch == l.epoch:
				// The record is cleared and nobody claimed it since.
				return settle.Landed, ""
			case found && r.Epoch > l.epoch && sent.Before(expiredAt):
				// Claimed by another owner since. Before our deadline only
				// our release could have freed it, so it was applied.
				return settle.Landed, ""
			}
			return settle.Dead, ""
		},
		// Every copy is filtered on this lease's owner, epoch and claim id,
		// which the first that applies clears: at most one applies.
		Resend:  true,
		Unknown: unknown[snapshot](opRelease, l.id),
	})
	switch {
	case errors.Is(err, ErrUnknownOutcome):
		return err
	case err != nil:
		return fmt.Errorf("lease: release %s: %w", idText(l.id), err)
	case res.Applied && prior != nil:
		return prior // expired locally before or meanwhile: a *LostError
	case res.Applied:
		if err := l.finish(ErrReleased); !errors.Is(err, ErrReleased) {
			return err
		}
		return nil
	}
	// Not applied: taken over or cleared by someone else.
	return l.notOurs(ctx, res.Read, res.HasRead, false, nil)
}

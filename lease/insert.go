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

// DoInsert is Do for a document that does not exist yet: it inserts doc with
// _id id and the lease already claimed in it, in one insert, and runs fn
// under that lease as Do does. doc must hold neither "_id" nor the lease
// field. The claim's expiry and first epoch come from the Clock's estimate
// of the server's time, whatever the Mode: the lease is renewed and fenced
// as in ModeEstimated (its Fence has no deadline on the server's clock). If
// a document with id exists, nothing is written and the error reports a
// duplicate key (store.IsDuplicateKey). A lost reply is settled by reading
// the document: this claim's, another's (a duplicate), or none (the insert
// is sent again: a copy fails on the unique _id). A named lease refuses it
// (ErrInvalid).
func (m *Manager) DoInsert(ctx context.Context, id any, doc bson.D, fn func(ctx context.Context, l *Lease) error) error {
	if m.named {
		return fmt.Errorf("lease: insert: a named lease has no document to insert: %w", ErrInvalid)
	}
	return m.do(ctx, id, doc, fn)
}

// insert makes the document of id from doc with this Manager's claim in it.
func (m *Manager) insert(ctx context.Context, id any, raw docKey, doc bson.D, parent context.Context) (*Lease, error) {
	ctx = store.NoSession(ctx)
	a := attempt{claim: bson.NewObjectID(), t0: m.c.Now()}
	var err error
	if a.est, err = m.estimate(ctx); err != nil {
		return nil, fmt.Errorf("lease: insert %v: %w", idText(id), err)
	}
	rec := record{Owner: m.c.Owner, Epoch: a.est.Latest().UnixMicro() + 1, Claim: a.claim}
	rec.ExpiresAt, rec.AcquiredAt = a.est.Time.Add(m.c.TTL).Truncate(time.Millisecond), a.est.Time.Truncate(time.Millisecond)
	full := append(append(bson.D{{Key: "_id", Value: id}}, doc...), bson.E{Key: m.c.Field, Value: bson.D{
		{Key: "owner", Value: rec.Owner}, {Key: "expiresAt", Value: rec.ExpiresAt},
		{Key: "acquiredAt", Value: rec.AcquiredAt}, {Key: "claim", Value: rec.Claim}, {Key: "epoch", Value: rec.Epoch},
	}})
	sent := 0
	res, err := settle.Exec(ctx, m.settling(ctx, opAcquire, id), settle.Write[struct{}, snapshot]{
		Send: func(ctx context.Context) (struct{}, bool, error) {
			sent++
			_, err := m.coll.InsertOne(ctx, full)
			if sent > 1 && store.IsDuplicateKey(err) {
				return struct{}{}, false, nil // a copy's: the read judges
			}
			return struct{}{}, err == nil, err
		},
		Read: m.reader(raw, false),
		Judge: func(s snapshot) (settle.Verdict, string) {
			switch {
			case s.found && s.rec.Owner == m.c.Owner && s.rec.Claim == a.claim:
				return settle.Landed, ""
			case s.found:
				return settle.Dead, ""
			}
			return settle.Live, ""
		},
		Resend: true,
		Unknown: func(_ snapshot, _ bool, reason string, err error) error {
			return &UnknownOutcomeError{Pkg: "lease", Op: "insert", ID: id, Reason: reason, Err: err}
		},
	})
	switch {
	case errors.Is(err, ErrUnknownOutcome):
		return nil, err
	case err == nil && !res.Applied:
		// Another's document, as a read showed: a duplicate key all the same.
		err = mongo.WriteException{WriteErrors: []mongo.WriteError{{Code: 11000, Message: "the document exists"}}}
	}
	if err != nil {
		return nil, fmt.Errorf("lease: insert %v: %w", idText(id), err)
	}
	return m.newLease(ctx, parent, id, raw, rec, a)
}

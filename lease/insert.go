package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

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
// is sent again: a copy fails on the unique _id). A named lease, or a field
// of doc named "", starting with "$", or under "_id" or the lease field, is
// refused before anything is sent (ErrInvalid).
func (m *Manager) DoInsert(ctx context.Context, id any, doc bson.D, fn func(ctx context.Context, l *Lease) error) error {
	if m.named {
		return fmt.Errorf("lease: insert: a named lease has no document to insert: %w", ErrInvalid)
	}
	if err := m.checkFields(doc); err != nil {
		return fmt.Errorf("lease: insert %v: %w", idText(id), err)
	}
	return m.do(ctx, id, doc, fn)
}

// checkFields refuses a field of DoInsert's document or ReleaseWith's $set
// that would clash with the lease's own write or act as an operator.
func (m *Manager) checkFields(d bson.D) error {
	for _, e := range d {
		root, _, _ := strings.Cut(e.Key, ".")
		if e.Key == "" || strings.HasPrefix(e.Key, "$") || root == "_id" || root == m.c.Field {
			return fmt.Errorf("field %q is empty, an operator, _id or the lease field: %w", e.Key, ErrInvalid)
		}
	}
	return nil
}

// insert is a claim (send) whose write inserts doc with this Manager's
// record in it, sent again while a read shows no document: a copy fails on
// the unique _id. A read that shows another's document is a duplicate key.
func (m *Manager) insert(ctx context.Context, id any, raw docKey, doc bson.D, parent context.Context) (*Lease, error) {
	ctx = store.NoSession(ctx)
	a := attempt{claim: bson.NewObjectID(), t0: m.c.Now()}
	var err error
	var full bson.Raw
	if a.est, err = m.estimate(ctx); err == nil {
		full, err = bson.Marshal(append(append(bson.D{{Key: "_id", Value: id}}, doc...), bson.E{Key: m.c.Field, Value: bson.D{
			{Key: "owner", Value: m.c.Owner}, {Key: "expiresAt", Value: a.est.Time.Add(m.c.TTL)},
			{Key: "acquiredAt", Value: a.est.Time}, {Key: "claim", Value: a.claim}, {Key: "epoch", Value: a.est.Latest().UnixMicro() + 1},
		}}))
	}
	if err != nil {
		return nil, fmt.Errorf("lease: insert %v: %w", idText(id), err)
	}
	sent := 0
	l, _, done, err := m.send(ctx, parent, id, raw, a, nil, true, func(ctx context.Context) (bson.Raw, error) {
		sent++
		if _, err := m.coll.InsertOne(ctx, full); sent == 1 || !store.IsDuplicateKey(err) {
			return full, err
		}
		return nil, nil // a copy's duplicate: the read judges
	})
	switch {
	case done, errors.Is(err, ErrUnknownOutcome):
		return l, err
	case err == nil:
		// Another's document, as a read showed: a duplicate key all the same.
		err = mongo.WriteException{WriteErrors: []mongo.WriteError{{Code: 11000, Message: "the document exists"}}}
	}
	return nil, fmt.Errorf("lease: insert %v: %w", idText(id), err)
}

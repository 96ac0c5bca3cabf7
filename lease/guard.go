package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/store"
)

// fencePath is the dotted path of this named lease's stamp: <FenceField>.
// <name> for a plain string name, else "#" + a hash of its BSON encoding.
func (l *Lease) fencePath() string {
	raw := l.raw.ID
	if s, ok := raw.StringValueOK(); ok && s != "" && checkField(s) == "" && !strings.HasPrefix(s, "#") {
		return l.m.c.FenceField + "." + s
	}
	h := sha256.New()
	h.Write([]byte{byte(raw.Type)})
	h.Write(raw.Value)
	return l.m.c.FenceField + ".#" + hex.EncodeToString(h.Sum(nil)[:16])
}

// Stamp records this named lease's epoch in the document of coll whose _id
// is id, the resource the lease protects, so that [Lease.Fence] matches it
// and the fenced writes of every earlier holder of the name fail from then
// on. Stamp a document before the first write to it
// under the lease. It is one updateOne filtered on the stamp being absent or
// not above this epoch, that sets it with $max: the stamp only moves forward,
// and it lives in the protected document, so it survives the clean-up of
// the lock document (whose next epoch is larger anyway: see DESIGN.md).
//
// Stamp returns a *LostError (Reason TakenOver, HolderEpoch the stamp found)
// when a later holder stamped the document first, or when the lease is no
// longer held; an error matching ErrNotFound when no document has that _id;
// ErrInvalid on a document lease, whose document carries its record itself;
// ErrInvalidID for an invalid id (nothing sent). With Options.ShardKey (the
// shard key of coll), id must be a [Key] and both the stamp and its re-read
// are sent to the one shard that owns the document. A session in ctx is used
// (the stamp may belong in the caller's transaction).
func (l *Lease) Stamp(ctx context.Context, coll *mongo.Collection, id any) error {
	if err := store.CheckContext(ctx); err != nil {
		return fmt.Errorf("lease: stamp %s: %w", idText(id), err)
	}
	if !l.m.named {
		return fmt.Errorf("lease: stamp %s: a document lease fences its own document (use Fence): %w", idText(id), ErrInvalid)
	}
	if coll == nil {
		return fmt.Errorf("lease: stamp %s: nil collection: %w", idText(id), ErrInvalid)
	}
	id, raw, err := key(l.m.c.shard, id)
	if err != nil {
		return fmt.Errorf("lease: stamp: %w", err)
	}
	if err := l.Err(); err != nil {
		return err
	}
	if l.TimeLeft() <= 0 {
		return l.finish(l.lost(Expired, record{}))
	}
	path := l.fencePath()
	filter := append(raw.Filter(), bson.E{Key: "$or", Value: bson.A{
		bson.D{{Key: path, Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: path, Value: bson.D{{Key: "$lte", Value: l.epoch}}}},
	}})
	update := bson.D{{Key: "$max", Value: bson.D{{Key: path, Value: l.epoch}}}}
	stamp := func(doc bson.Raw) bson.RawValue { return doc.Lookup(strings.Split(path, ".")...) }
	// Sent again while the document shows no stamp of this epoch or later:
	// copies of a $max make one change.
	cfg := settle.Config{Retry: l.m.readPolicy(), ResolveTimeout: l.m.c.ResolveTimeout}
	majority := l.m.majorityOf(coll)
	read := func(ctx context.Context) (doc bson.Raw, err error) {
		ctx = store.NoSession(ctx)
		err = majority.Read(ctx, func(coll *mongo.Collection) error {
			if doc, err = coll.FindOne(ctx, raw.Filter()).Raw(); errors.Is(err, mongo.ErrNoDocuments) {
				return nil // an answer: no document
			}
			return err
		})
		return doc, err
	}
	res, err := settle.Exec(ctx, cfg, settle.Write[struct{}, bson.Raw]{
		Send: func(ctx context.Context) (struct{}, bool, error) {
			res, err := coll.UpdateOne(ctx, filter, update)
			return struct{}{}, err == nil && res.MatchedCount == 1, err
		},
		Read: read,
		Judge: func(doc bson.Raw) (settle.Verdict, string) {
			v := stamp(doc)
			n, ok := v.AsInt64OK()
			switch {
			case ok && n == l.epoch:
				return settle.Landed, ""
			case doc != nil && (v.Type == 0 || ok && n < l.epoch):
				return settle.Live, ""
			}
			return settle.Dead, ""
		},
		Resend:  true,
		Unknown: unknown[bson.Raw]("stamp", id),
	})
	switch {
	case err == nil && res.Applied:
		return nil
	case errors.Is(err, ErrUnknownOutcome):
		return err
	case err != nil:
		return fmt.Errorf("lease: stamp %s: %w", idText(id), err)
	case !res.HasRead:
		if res.Read, err = settle.Reread(ctx, cfg, read); err != nil {
			return fmt.Errorf("lease: stamp %s: read after a failed stamp: %w", idText(id), err)
		}
	}
	v := stamp(res.Read)
	n, ok := v.AsInt64OK()
	switch {
	case res.Read == nil:
		return fmt.Errorf("lease: stamp %s: %w", idText(id), ErrNotFound)
	case ok && n == l.epoch:
		return nil
	case ok && n > l.epoch:
		lost := l.lost(TakenOver, record{})
		lost.HolderEpoch = n
		return lost
	}
	return fmt.Errorf("lease: stamp %s: field %s holds a %v, not an epoch", idText(id), path, v.Type)
}

// collMajority is the majority reader of a collection Stamp was given.
type collMajority struct {
	coll *mongo.Collection
	*settle.Majority
}

// majorityOf returns the majority reader of coll, kept from the last Stamp
// on the same coll so that a server's refusal of majority is learnt once.
func (m *Manager) majorityOf(coll *mongo.Collection) *settle.Majority {
	if c := m.stamped.Load(); c != nil && c.coll == coll {
		return c.Majority
	}
	c := &collMajority{coll: coll, Majority: settle.NewMajority(coll)}
	m.stamped.Store(c)
	return c.Majority
}

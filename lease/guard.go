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

	"github.com/mongocas/mongocas/store"
)

// fencePath is the dotted path of this named lease's stamp in a protected
// document: <FenceField>.<key>, where key is the name itself when it is a
// plain string usable as a field name, and "#" + a hash of its BSON encoding
// otherwise (names with ".", a leading "$" or "#", non-strings).
func (l *Lease) fencePath() string {
	return l.m.c.fenceField + "." + fenceKey(l.raw.ID)
}

func fenceKey(raw bson.RawValue) string {
	if s, ok := raw.StringValueOK(); ok && s != "" && checkField(s) == "" && !strings.HasPrefix(s, "#") {
		return s
	}
	h := sha256.New()
	h.Write([]byte{byte(raw.Type)})
	h.Write(raw.Value)
	return "#" + hex.EncodeToString(h.Sum(nil)[:16])
}

// Stamp records this named lease's epoch in the document of coll whose _id
// is id, the resource the lease protects, so that [Lease.Fence] matches it
// and the fenced writes of every earlier holder of
// the name fail from then on. Stamp a document before the first write to it
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
	res, err := coll.UpdateOne(ctx, filter, update)
	switch {
	case err == nil && res.MatchedCount == 1:
		return nil
	case err != nil && !ambiguous(err):
		return fmt.Errorf("lease: stamp %s: %w", idText(id), err)
	}
	// Not matched, or unknown: the stamp tells. $max is idempotent, so an
	// ambiguous stamp that shows our epoch was applied.
	rctx, cancel := l.m.detached(ctx)
	defer cancel()
	doc, rerr := coll.FindOne(rctx, raw.Filter()).Raw()
	switch {
	case errors.Is(rerr, mongo.ErrNoDocuments):
		return fmt.Errorf("lease: stamp %s: %w", idText(id), ErrNotFound)
	case rerr != nil && err != nil:
		return &UnknownOutcomeError{Pkg: "lease", Op: "stamp", ID: id, Reason: "re-reading failed", Err: errors.Join(err, rerr)}
	case rerr != nil:
		return fmt.Errorf("lease: stamp %s: read after a failed stamp: %w", idText(id), rerr)
	}
	v := doc.Lookup(strings.Split(path, ".")...)
	stamped, ok := v.AsInt64OK()
	switch {
	case ok && stamped == l.epoch:
		return nil
	case ok && stamped > l.epoch:
		lost := l.lost(TakenOver, record{})
		lost.HolderEpoch = stamped
		return lost
	}
	return fmt.Errorf("lease: stamp %s: field %s holds a %v, not an epoch", idText(id), path, v.Type)
}

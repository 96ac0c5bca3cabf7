package lease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/store"
)

// ErrNotNamed is matched by the error EnsureIndexes and Sweep return on a
// Manager made by New: they delete lock documents, never leased documents.
var ErrNotNamed = errors.New("lease: not a named-lease manager")

// TTLIndexName returns the name of the TTL index EnsureIndexes creates for
// the lease field field.
func TTLIndexName(field string) string { return "mongocas_lease_" + field + "_ttl" }

// EnsureIndexes prepares the lock collection of a named-lease Manager for the
// clean-up of stale lock documents. Where the server supports TTL indexes (as
// store.Probe finds by trying) it creates one on <field>.expiresAt with
// expireAfterSeconds of Options.CleanupAfter, and reports true: the server
// then deletes a lock document CleanupAfter after its lease expired or was
// released. Elsewhere (FerretDB v1, for one) it creates nothing and reports
// false: call Sweep from time to time instead, or let lock documents stay
// (each is a few dozen bytes). It is idempotent.
//
// Deleting a lock document restarts its epoch at 1. A fencing token of a named
// lease therefore increases strictly only while its document lives, which is
// at least CleanupAfter after the last holder's expiry.
func (m *Manager) EnsureIndexes(ctx context.Context) (ttl bool, err error) {
	if !m.named {
		return false, fmt.Errorf("lease: ensure indexes: %w", ErrNotNamed)
	}
	caps, err := store.Probe(ctx, m.coll.Database())
	if err != nil {
		return false, fmt.Errorf("lease: ensure indexes: %w", err)
	}
	if !caps.TTLIndexes {
		return false, nil
	}
	secs := min(int64(m.c.cleanupAfter/time.Second), math.MaxInt32)
	model := mongo.IndexModel{
		Keys: bson.D{{Key: m.pExpires, Value: 1}},
		Options: options.Index().
			SetName(TTLIndexName(m.c.field)).
			SetExpireAfterSeconds(int32(secs)), //nolint:gosec // secs is clamped to MaxInt32 above

	}
	if _, err := m.coll.Indexes().CreateOne(ctx, model); err != nil {
		return false, fmt.Errorf("lease: ensure indexes: %w", err)
	}
	return true, nil
}

// Sweep deletes the lock documents of a named-lease Manager whose lease
// expired or was released more than Options.CleanupAfter ago, on the server's
// clock, and returns how many it deleted. Each deletion is one deleteOne that
// re-checks the expiry, so a document claimed meanwhile is kept. It is the
// clean-up for servers without TTL indexes; see EnsureIndexes.
func (m *Manager) Sweep(ctx context.Context) (int, error) {
	if !m.named {
		return 0, fmt.Errorf("lease: sweep: %w", ErrNotNamed)
	}
	est, err := m.c.clock.Now(ctx)
	if err != nil {
		return 0, fmt.Errorf("lease: sweep: %w", err)
	}
	stale := bson.D{{Key: m.pExpires, Value: bson.D{{Key: "$lt", Value: cutoff(est).Add(-m.c.cleanupAfter)}}}}
	// One statement: the server checks the filter on each document as it
	// deletes it, so a lock claimed meanwhile is left alone.
	res, err := m.coll.DeleteMany(ctx, stale)
	if err != nil {
		return 0, fmt.Errorf("lease: sweep: %w", err)
	}
	return int(res.DeletedCount), nil
}

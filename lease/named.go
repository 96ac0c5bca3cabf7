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
var ErrNotNamed = errors.New("not a named-lease manager")

// TTLIndexName returns the name of the TTL index EnsureIndexes creates for
// the lease field field.
func TTLIndexName(field string) string { return "mongocas_lease_" + field + "_ttl" }

// EnsureIndexes prepares the lock collection of a named-lease Manager for the
// clean-up of stale lock documents. Where the server deletes documents with
// TTL indexes (store.Capabilities.TTLIndexes, probed once per client: not
// FerretDB v1, which accepts them but never deletes) it creates a TTL index
// on <field>.expiresAt with expireAfterSeconds of Options.CleanupAfter, and
// reports true: the server then deletes a lock
// document CleanupAfter after its lease expired or was released. Elsewhere it
// creates nothing and reports false: call Sweep from time to time instead,
// or let lock documents stay (each is a few dozen bytes). It is idempotent.
//
// Deleting a lock document does not restart its epoch: the next claim of the
// name starts from the server's time in microseconds, above every epoch the
// deleted document gave out (see DESIGN.md).
func (m *Manager) EnsureIndexes(ctx context.Context) (ttl bool, err error) {
	if err := store.CheckContext(ctx); err != nil {
		return false, fmt.Errorf("lease: ensure indexes: %w", err)
	}
	if !m.named {
		return false, fmt.Errorf("lease: ensure indexes: %w", ErrNotNamed)
	}
	ctx = store.NoSession(ctx)
	caps, err := store.For(m.coll.Database().Client()).Capabilities(ctx, m.coll.Database())
	if err != nil {
		return false, fmt.Errorf("lease: ensure indexes: %w", err)
	}
	if !caps.TTLIndexes {
		return false, nil
	}
	secs := min(int64(m.c.CleanupAfter/time.Second), math.MaxInt32)
	model := mongo.IndexModel{
		Keys: bson.D{{Key: m.pExpires, Value: 1}},
		Options: options.Index().
			SetName(TTLIndexName(m.c.Field)).
			SetExpireAfterSeconds(int32(secs)), //nolint:gosec // secs is clamped to MaxInt32 above
	}
	if _, err := m.coll.Indexes().CreateOne(ctx, model); err != nil {
		return false, fmt.Errorf("lease: ensure indexes: %w", err)
	}
	return true, nil
}

// Sweep deletes the lock documents of a named-lease Manager whose lease
// expired or was released more than Options.CleanupAfter ago, on the server's
// clock ($$NOW in ModeServer, the earliest the estimate allows in
// ModeEstimated), and returns how many it deleted. It is one deleteMany: the
// server checks the filter on each document as it deletes it, so a lock
// claimed meanwhile is kept. It is the clean-up for servers without TTL
// indexes; see EnsureIndexes.
func (m *Manager) Sweep(ctx context.Context) (int, error) {
	if err := store.CheckContext(ctx); err != nil {
		return 0, fmt.Errorf("lease: sweep: %w", err)
	}
	if !m.named {
		return 0, fmt.Errorf("lease: sweep: %w", ErrNotNamed)
	}
	ctx = store.NoSession(ctx)
	server, err := m.serverMode(ctx)
	if err != nil {
		return 0, fmt.Errorf("lease: sweep: %w", err)
	}
	var stale bson.D
	if server {
		limit := bson.D{{Key: "$subtract", Value: bson.A{"$$NOW", m.c.CleanupAfter.Milliseconds()}}}
		stale = bson.D{
			{Key: m.pExpires, Value: bson.D{{Key: "$exists", Value: true}}},
			{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{"$" + m.pExpires, limit}}}},
		}
	} else {
		est, err := m.estimate(ctx)
		if err != nil {
			return 0, fmt.Errorf("lease: sweep: %w", err)
		}
		stale = bson.D{{Key: m.pExpires, Value: bson.D{{Key: "$lt", Value: cutoff(est).Add(-m.c.CleanupAfter)}}}}
	}
	res, err := m.coll.DeleteMany(ctx, stale)
	if err != nil {
		return 0, fmt.Errorf("lease: sweep: %w", err)
	}
	return int(res.DeletedCount), nil
}

package idempotency

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/store"
)

// TTLIndexName is the name of the TTL index EnsureIndexes creates.
const TTLIndexName = "mongocas_idempotency_expire"

// EnsureIndexes prepares the collection for the clean-up of old records.
// Where the server deletes with TTL indexes (probed once per client), it
// creates one on the records' retention time (the server deletes a record
// some time after it) and reports true. Elsewhere (FerretDB v1) it creates
// nothing and reports false: call Sweep from time to time instead. It is
// idempotent; call it once at start-up.
func (k *Keys) EnsureIndexes(ctx context.Context) (ttl bool, err error) {
	if err := store.CheckContext(ctx); err != nil {
		return false, fmt.Errorf("idempotency: ensure indexes: %w", err)
	}
	caps, err := store.For(k.coll.Database().Client()).Capabilities(ctx, k.coll.Database())
	if err != nil {
		return false, fmt.Errorf("idempotency: ensure indexes: %w", err)
	}
	if !caps.TTLIndexes {
		return false, nil
	}
	model := mongo.IndexModel{
		Keys:    bson.D{{Key: "expireAt", Value: 1}},
		Options: options.Index().SetName(TTLIndexName).SetExpireAfterSeconds(0),
	}
	if _, err := k.coll.Indexes().CreateOne(ctx, model); err != nil {
		return false, fmt.Errorf("idempotency: ensure indexes: %w", err)
	}
	return true, nil
}

// Sweep deletes the records whose retention time has passed on the
// server's clock in one deleteMany, and returns how many it deleted. A
// record whose request is running is never past its retention time. It is
// the clean-up for servers without TTL indexes.
func (k *Keys) Sweep(ctx context.Context) (int, error) {
	if err := store.CheckContext(ctx); err != nil {
		return 0, fmt.Errorf("idempotency: sweep: %w", err)
	}
	mode, err := k.leases.Mode(ctx)
	if err != nil {
		return 0, fmt.Errorf("idempotency: sweep: %w", err)
	}
	var filter bson.D
	if mode == lease.ModeServer {
		filter = bson.D{
			{Key: "expireAt", Value: bson.D{{Key: "$exists", Value: true}}},
			{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{"$expireAt", "$$NOW"}}}},
		}
	} else {
		est, err := k.leases.Clock().Now(ctx)
		if err != nil {
			return 0, fmt.Errorf("idempotency: sweep: %w", err)
		}
		filter = bson.D{{Key: "expireAt", Value: bson.D{{Key: "$lt", Value: est.Earliest()}}}}
	}
	res, err := k.coll.DeleteMany(ctx, filter)
	if err != nil {
		return 0, fmt.Errorf("idempotency: sweep: %w", err)
	}
	return int(res.DeletedCount), nil
}

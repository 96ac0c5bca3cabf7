package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/store"
)

// Mode returns the mode the Manager judges expiry in: Options.Mode if it was
// forced, else the one found by trying the server (once per Manager, on the
// first call that needs it; a failure to reach the server is returned and
// tried again next time).
func (m *Manager) Mode(ctx context.Context) (Mode, error) {
	if err := store.CheckContext(ctx); err != nil {
		return ModeAuto, fmt.Errorf("lease: mode: %w", err)
	}
	server, err := m.serverMode(noSession(ctx))
	switch {
	case err != nil:
		return ModeAuto, fmt.Errorf("lease: mode: %w", err)
	case server:
		return ModeServer, nil
	default:
		return ModeEstimated, nil
	}
}

// serverMode reports whether the Manager runs in ModeServer, probing the
// server on first use in ModeAuto.
func (m *Manager) serverMode(ctx context.Context) (bool, error) {
	if mode := Mode(m.mode.Load()); mode != ModeAuto {
		return mode == ModeServer, nil
	}
	m.modeMu.Lock()
	defer m.modeMu.Unlock()
	if mode := Mode(m.mode.Load()); mode != ModeAuto {
		return mode == ModeServer, nil
	}
	ok, err := probeServerTime(ctx, m.coll.Database())
	if err != nil {
		return false, err
	}
	mode := ModeEstimated
	if ok {
		mode = ModeServer
	}
	m.mode.Store(int32(mode))
	return ok, nil
}

// probeServerTime finds, by their effect, whether $expr with $$NOW works in
// a write filter and $$NOW in an update pipeline: on a scratch document of
// store.ProbeCollection whose t is the Unix epoch, a findAndModify filtered
// on t < $$NOW sets t to $$NOW + 1 minute with a pipeline and must return
// it; then a count filtered on t < $$NOW must find nothing. The document is
// deleted afterwards. A server that refuses either reports false; one that
// cannot be reached, or refuses the scratch insert, an error.
func probeServerTime(ctx context.Context, db *mongo.Database) (bool, error) {
	coll := db.Collection(store.ProbeCollection)
	id := bson.NewObjectID()
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "t", Value: time.Unix(0, 0)}}); err != nil {
		return false, fmt.Errorf("probe $$NOW: insert into %s.%s: %w", db.Name(), store.ProbeCollection, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = coll.DeleteOne(dctx, bson.D{{Key: "_id", Value: id}})
	}()
	expired := bson.D{{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{"$t", "$$NOW"}}}}}
	filter := append(bson.D{{Key: "_id", Value: id}}, expired...)
	pipe := mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "t", Value: bson.D{{Key: "$add", Value: bson.A{"$$NOW", int64(60_000)}}}}}}}}
	var doc struct {
		T time.Time `bson:"t"`
	}
	err := coll.FindOneAndUpdate(ctx, filter, pipe, options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&doc)
	var se mongo.ServerError
	switch {
	case errors.As(err, &se), errors.Is(err, mongo.ErrNoDocuments):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("probe $$NOW: %w", err)
	case !doc.T.After(time.Unix(60, 0)):
		return false, nil
	}
	n, err := coll.CountDocuments(ctx, filter)
	switch {
	case errors.As(err, &se):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("probe $$NOW: %w", err)
	}
	return n == 0, nil
}

package versioned_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/versioned"
)

// commandLog records the CRUD commands a client sends.
type commandLog struct {
	mu    sync.Mutex
	names []string
}

func (l *commandLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.names
	l.names = nil
	return out
}

// TestRoundTrips backs the doc's promises: Get, Update, Delete and Guarded
// are one round trip each (Guarded once the repository has seen the
// document), and Modify is two per attempt (a read and a write).
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	_, b := setup[item](t, nil)
	log := &commandLog{}
	crud := map[string]bool{"find": true, "insert": true, "update": true, "delete": true, "findAndModify": true}
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if crud[e.CommandName] && e.DatabaseName == b.db.Name() {
			log.mu.Lock()
			log.names = append(log.names, e.CommandName)
			log.mu.Unlock()
		}
	}}
	client, err := mongo.Connect(options.Client().ApplyURI(b.db.Server.URI).SetMonitor(mon))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	repo, err := versioned.New[item](client.Database(b.db.Name()).Collection(b.coll.Name()), nil)
	require.NoError(t, err)
	ctx := b.ctx

	it := &item{SKU: "sku-1", Stock: 10}
	require.NoError(t, repo.Insert(ctx, it))
	require.Equal(t, []string{"insert"}, log.take())

	got, err := repo.Get(ctx, "sku-1")
	require.NoError(t, err)
	require.Equal(t, []string{"find"}, log.take())

	got.Stock = 9
	require.NoError(t, repo.Update(ctx, got))
	require.Equal(t, []string{"update"}, log.take())

	_, err = repo.Guarded(ctx, "sku-1",
		bson.D{{Key: "stock", Value: bson.D{{Key: "$gte", Value: 3}}}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -3}}}})
	require.NoError(t, err)
	require.Equal(t, []string{"findAndModify"}, log.take())

	after, err := repo.Modify(ctx, "sku-1", func(i *item) error { i.Stock++; return nil })
	require.NoError(t, err)
	// Uncontended, the write is an updateOne on every server (its pipeline
	// form waits for a conflict: TestConflictCostsOneRoundTrip).
	require.Equal(t, []string{"find", "update"}, log.take())
	require.Equal(t, int64(7), after.Stock)

	require.NoError(t, repo.Delete(ctx, after))
	require.Equal(t, []string{"delete"}, log.take())
}

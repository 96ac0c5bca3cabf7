package store_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

// TestProbeKnowsEachServer holds Probe to the exact capabilities of each
// kind of server the suite runs on, so a probe that starts to believe a
// server (or stops believing one) fails here instead of skipping or
// failing tests elsewhere.
func TestProbeKnowsEachServer(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	caps, err := store.Probe(ctx, db.Database)
	require.NoError(t, err)
	t.Logf("%s", caps)
	require.NotEmpty(t, caps.Version)

	switch caps.Server {
	case store.FerretDBv1:
		// FerretDB v1 (the embedded backend): none of it.
		require.Equal(t, store.Capabilities{Topology: store.Standalone, Server: store.FerretDBv1, Version: caps.Version}, caps)
	case store.FerretDBv2:
		// FerretDB v2 on DocumentDB, as start.sh configures it: no
		// transactions (startTransaction is accepted, the writes apply at
		// once), everything else.
		require.Equal(t, store.Capabilities{
			Topology: store.Standalone, Server: store.FerretDBv2, Version: caps.Version,
			Expr: true, UpdatePipelines: true, TTLIndexes: true,
		}, caps)
	case store.MongoDB:
		replicated := caps.Topology != store.Standalone
		require.Equal(t, store.Capabilities{
			Topology: caps.Topology, Server: store.MongoDB, Version: caps.Version,
			Transactions: replicated, RetryableWrites: replicated,
			Expr: true, UpdatePipelines: true, TTLIndexes: true,
		}, caps)
	default:
		t.Fatalf("unknown server kind %q", caps.Server)
	}
	if db.Server.Backend == mongotest.BackendEmbedded {
		require.Equal(t, store.FerretDBv1, caps.Server)
	}

	// Nothing is left behind: not the probe's collection with its
	// documents (of the transaction probe too, whether or not the server
	// has transactions) and its TTL index.
	requireNoProbeCollection(t, db)
}

// requireNoProbeCollection fails t if a probe's scratch collection is left
// in db.
func requireNoProbeCollection(t *testing.T, db *mongotest.DB) {
	t.Helper()
	names, err := db.ListCollectionNames(t.Context(), bson.D{{Key: "name", Value: bson.D{{Key: "$regex", Value: "^" + store.ProbeCollection}}}})
	require.NoError(t, err)
	require.Empty(t, names, "a probe left its scratch collection")
}

// TestConcurrentProbesAgree: probes that run at once on one database (two
// clients of one service starting together, or store.For's probe beside
// another) find the same capabilities: one must not drop the other's
// scratch TTL index between its creation and its listing, which reported a
// server with TTL indexes as one without (and a queue then made no TTL
// index). Run where the server has TTL indexes.
func TestConcurrentProbesAgree(t *testing.T) {
	mongotest.Use(t, mongotest.TTLIndexes)
	db := mongotest.New(t)
	ctx := context.Background()
	const probes = 8
	caps := make([]store.Capabilities, probes)
	errs := make([]error, probes)
	var wg sync.WaitGroup
	for i := range probes {
		wg.Go(func() { caps[i], errs[i] = store.Probe(ctx, db.Database) })
	}
	wg.Wait()
	for i := range probes {
		require.NoError(t, errs[i])
		require.True(t, caps[i].TTLIndexes, "probe %d: %s", i, caps[i])
		require.Equal(t, db.Caps(), caps[i], "probe %d", i)
	}
}

package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) { mongotest.Main(m) }

// TestRun runs the program three times on the test server, in the test's
// own database: two orders take 2 mugs and 1 kettle each; the third finds
// the kettles gone and moves nothing, not even its mugs.
func TestRun(t *testing.T) {
	db := mongotest.New(t)
	for range 3 {
		require.NoError(t, run(t.Context(), db.Server.URI, db.Name(), "order-17"))
	}
	items, err := versioned.New[Item](db.Collection("items"), nil)
	require.NoError(t, err)
	for id, want := range map[string]int64{"mug": 1, "kettle": 0, "order-17": 6} {
		it, err := items.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, want, it.Stock, id)
	}
}

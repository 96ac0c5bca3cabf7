package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
)

func TestMain(m *testing.M) { mongotest.Main(m) }

// TestRun runs the program twice (the second run finds its documents) on
// the test server, in the test's own database.
func TestRun(t *testing.T) {
	db := mongotest.New(t)
	require.NoError(t, run(t.Context(), db.Server.URI, db.Name()))
	require.NoError(t, run(t.Context(), db.Server.URI, db.Name()))
}

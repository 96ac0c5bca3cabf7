package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) { mongotest.Main(m) }

// TestRun runs the program until ana has too little (100, 70, 40, 10, then
// nothing moved) on the test server, in the test's own database: every
// move settles, and what left ana reached ben.
func TestRun(t *testing.T) {
	db := mongotest.New(t)
	for range 5 {
		require.NoError(t, run(t.Context(), db.Server.URI, db.Name()))
	}
	accounts, err := versioned.New[Account](db.Collection("accounts"), nil)
	require.NoError(t, err)
	for id, want := range map[string]int64{"ana": 10, "ben": 90} {
		a, err := accounts.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, want, a.Balance, id)
	}
}

package scenario

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/examples/internal/exampledb"
	"github.com/mongocas/mongocas/mongotest"
)

// TestOpenWithURI covers the -uri path of the programs: a server named by
// URI gets a fresh database, probed, and dropped at Close.
func TestOpenWithURI(t *testing.T) {
	t.Parallel()
	srv := mongotest.New(t).Server
	ctx := t.Context()
	db, err := exampledb.Open(ctx, srv.URI, "uri_test")
	require.NoError(t, err)
	require.Equal(t, srv.Caps.Transactions, db.Caps.Transactions)
	require.Contains(t, db.Name(), "uri_test")
	_, err = db.Collection("c").InsertOne(ctx, map[string]int{"n": 1})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	names, err := srv.Client.ListDatabaseNames(ctx, map[string]any{"name": db.Name()})
	require.NoError(t, err)
	require.Empty(t, names, "Close drops the database")
}

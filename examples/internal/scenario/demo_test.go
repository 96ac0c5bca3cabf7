package scenario

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/examples/internal/exampledb"
	"github.com/mongocas/mongocas/mongotest"
)

func TestDemoRunsEndToEnd(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	var out bytes.Buffer
	rep, err := RunDemo(context.Background(), db.Database, db.Caps(), Config{
		Inventory: smallInventory,
		Wallet:    WalletConfig{Wallets: 2, Operations: 40, Transfers: 10, Concurrency: 4, Seed: 1},
		Identity:  IdentityConfig{Users: 3, Switches: 2, LatencyMin: time.Millisecond, LatencyMax: 5 * time.Millisecond, Seed: 1},
	}, &out)
	require.NoError(t, err)
	require.True(t, rep.OK(), out.String())
	want := 6
	if db.Caps().Transactions {
		want = 8
	} else {
		require.Len(t, rep.Skipped, 2, "one line each for the transfer and the transaction anti-pattern")
	}
	require.Len(t, rep.Rows, want)
	require.Contains(t, out.String(), "scenario   strategy")
	require.Contains(t, out.String(), "ok: no mongocas strategy showed an anomaly")
	t.Log("\n" + out.String())
}

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

package scenario

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
)

// smallInventory keeps a run under a second on the embedded server.
var smallInventory = InventoryConfig{Buyers: 20, Items: 5}

func TestInventoryNaiveAccounting(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	r, err := RunInventory(t.Context(), db.Database, InventoryNaive, smallInventory)
	require.NoError(t, err)
	require.Equal(t, KindNaive, r.Kind)
	require.Equal(t, 0, r.Errors, r.Details)
	require.Equal(t, smallInventory.Buyers, r.Orders+r.SoldOut)
	// Its $inc is atomic, so the stock is exactly the items minus the orders,
	// however many were oversold.
	require.Equal(t, int64(smallInventory.Items-r.Orders), r.FinalStock)
	require.Equal(t, max(r.Orders-smallInventory.Items, 0), r.Oversold)
	require.Equal(t, r.Oversold, r.Anomalies)
	t.Logf("naive: %s", r.Details[0])
}

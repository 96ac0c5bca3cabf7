package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

// A write whose reply is lost is applied once: the repository finds its
// write id in the document and reports success.
func TestTakeLostReply(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil) // a client whose traffic the test can break
	items, err := versioned.New[Item](f.Collection("items"), nil)
	require.NoError(t, err)
	require.NoError(t, items.Insert(t.Context(), &Item{SKU: "mug", Stock: 5}))
	f.DropNextReply(mongotest.Writes("items"))
	require.NoError(t, Take(t.Context(), items, "mug", 1))
	mug, err := items.Get(t.Context(), "mug")
	require.NoError(t, err)
	require.Equal(t, int64(4), mug.Stock)
}

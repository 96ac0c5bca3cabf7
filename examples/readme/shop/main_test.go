package main

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) { mongotest.Main(m) }

func TestTakeNeverOversells(t *testing.T) {
	db := mongotest.New(t) // a fresh database, dropped when the test ends
	items, err := versioned.New[Item](db.Collection("items"), nil)
	require.NoError(t, err)
	require.NoError(t, items.Insert(t.Context(), &Item{SKU: "mug", Stock: 5}))
	var dup *versioned.DuplicateError // typed errors carry the facts
	require.ErrorAs(t, items.Insert(t.Context(), &Item{SKU: "mug"}), &dup)

	var sold atomic.Int64
	var wg sync.WaitGroup
	for range 20 { // twenty buyers at once, five mugs
		wg.Go(func() {
			if err := Take(t.Context(), items, "mug", 1); err == nil {
				sold.Add(1)
			} else if !errors.Is(err, ErrSoldOut) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(5), sold.Load())
}

package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/examples/internal/scenario"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

func TestCheckoutNeverOversells(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	cfg := scenario.InventoryConfig{Buyers: 20, Items: 5}
	r, err := scenario.RunInventory(t.Context(), db.Database, checkout, cfg)
	require.NoError(t, err)
	require.Equal(t, scenario.KindMongocas, r.Kind)
	require.Equal(t, 0, r.Errors, r.Details)
	require.Equal(t, cfg.Items, r.Orders, "every item is sold")
	require.Equal(t, cfg.Buyers-cfg.Items, r.SoldOut, "everyone else is told sold out")
	require.Equal(t, int64(0), r.FinalStock)
	require.Equal(t, 0, r.Oversold)
	require.Equal(t, 0, r.Anomalies)
	require.Equal(t, cfg.Buyers, r.Latency.N)
}

func TestShopAnswers(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	ctx := t.Context()
	s, err := newShop(db.Collection("products"), nil)
	require.NoError(t, err)
	require.NoError(t, s.AddProduct(ctx, "mug", "a mug", 1))
	require.ErrorIs(t, s.AddProduct(ctx, "mug", "a mug", 1), versioned.ErrDuplicate)
	require.NoError(t, s.Buy(ctx, "mug"))
	require.ErrorIs(t, s.Buy(ctx, "mug"), errSoldOut)
	require.ErrorIs(t, s.Buy(ctx, "cup"), versioned.ErrNotFound)
	p, err := s.products.Get(ctx, "mug")
	require.NoError(t, err)
	require.Zero(t, p.Stock, "the sold-out answer took nothing")
}

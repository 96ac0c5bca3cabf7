package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/examples/internal/scenario"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

// small keeps a run to a second or two on the embedded server.
var small = scenario.WalletConfig{Wallets: 3, Operations: 90, Transfers: 30, Concurrency: 6, Opening: 2000, MaxAmount: 800, Seed: 7}

func TestModifyKeepsEveryBalanceExact(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	r, err := scenario.RunWallet(t.Context(), db.Database, service, db.Caps().Transactions, small)
	require.NoError(t, err)
	require.Equal(t, 0, r.Errors, r.Details)
	require.Equal(t, small.Operations, r.Acknowledged+r.Declined)
	require.Equal(t, r.Expected, r.Actual, "balance = opening + acknowledged deltas, wallet by wallet")
	require.Equal(t, r.ExpectedTotal, r.ActualTotal)
	for _, b := range r.Actual {
		require.GreaterOrEqual(t, b, int64(0))
	}
	require.Equal(t, 0, r.Anomalies)
	t.Logf("modify: %s", strings.Join(r.Details, "; "))
}

func TestTransferInTransaction(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	transfers := scenario.WithTransfers(service)
	if !db.Caps().Transactions {
		// A pass of its own, not hidden behind the skip below.
		t.Run("refused without transactions", func(t *testing.T) {
			_, err := scenario.RunWallet(t.Context(), db.Database, transfers, false, small)
			require.ErrorIs(t, err, scenario.ErrNoTransactions, "without transactions the transfer is refused, never faked")
		})
	}
	db.Require(t, mongotest.Transactions)
	r, err := scenario.RunWallet(t.Context(), db.Database, transfers, true, small)
	require.NoError(t, err)
	require.Equal(t, 0, r.Errors, r.Details)
	require.Equal(t, small.Operations+small.Transfers, r.Acknowledged+r.Declined)
	require.Equal(t, r.Expected, r.Actual)
	require.Equal(t, 0, r.Anomalies)
}

func TestWalletAnswers(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	ctx := t.Context()
	w, err := newWallets(db.Collection("wallets"), nil)
	require.NoError(t, err)
	require.NoError(t, w.Create(ctx, "ana", "Ana", 100))
	require.ErrorIs(t, w.Create(ctx, "ana", "Ana", 100), versioned.ErrDuplicate)
	require.NoError(t, w.Change(ctx, "ana", -60))
	require.ErrorIs(t, w.Change(ctx, "ana", -60), errInsufficientFunds)
	require.ErrorIs(t, w.Change(ctx, "bob", 10), versioned.ErrNotFound)
	got, err := w.repo.Get(ctx, "ana")
	require.NoError(t, err)
	require.Equal(t, int64(40), got.Balance, "the declined debit wrote nothing")
	require.Zero(t, w.ConflictsRetried(), "one writer never conflicts")
}

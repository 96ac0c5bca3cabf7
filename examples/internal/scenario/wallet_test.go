package scenario

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
)

// smallWallet keeps a run to a second or two on the embedded server.
var smallWallet = WalletConfig{Wallets: 3, Operations: 90, Transfers: 30, Concurrency: 6, Opening: 2000, MaxAmount: 800, Seed: 7}

func TestWalletModifyKeepsEveryBalanceExact(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	r, err := RunWallet(t.Context(), db.Database, WalletModify, db.Caps().Transactions, smallWallet)
	require.NoError(t, err)
	require.Equal(t, 0, r.Errors, r.Details)
	require.Equal(t, smallWallet.Operations, r.Acknowledged+r.Declined)
	require.Equal(t, r.Expected, r.Actual, "balance = opening + acknowledged deltas, wallet by wallet")
	require.Equal(t, r.ExpectedTotal, r.ActualTotal)
	for _, b := range r.Actual {
		require.GreaterOrEqual(t, b, int64(0))
	}
	require.Equal(t, 0, r.Anomalies)
	t.Logf("modify: %s", strings.Join(r.Details, "; "))
}

func TestWalletNaiveAccounting(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	r, err := RunWallet(t.Context(), db.Database, WalletNaive, false, smallWallet)
	require.NoError(t, err)
	require.Equal(t, 0, r.Errors, r.Details)
	require.Equal(t, smallWallet.Operations, r.Acknowledged+r.Declined)
	require.Equal(t, int64(0), r.ConflictsRetried, "the naive way never sees a conflict")
	var sum, want int64
	for i := range r.Actual {
		sum += r.Actual[i]
		want += r.Expected[i]
	}
	require.Equal(t, sum, r.ActualTotal)
	require.Equal(t, want, r.ExpectedTotal)
	t.Logf("naive: %s", strings.Join(r.Details, "; "))
}

func TestWalletTransferInTransaction(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	if !db.Caps().Transactions {
		// A pass of its own, not hidden behind the skip below.
		t.Run("refused without transactions", func(t *testing.T) {
			_, err := RunWallet(t.Context(), db.Database, WalletTransfer, false, smallWallet)
			require.ErrorIs(t, err, ErrNoTransactions, "without transactions the transfer is refused, never faked")
		})
	}
	db.Require(t, mongotest.Transactions)
	r, err := RunWallet(t.Context(), db.Database, WalletTransfer, true, smallWallet)
	require.NoError(t, err)
	require.Equal(t, 0, r.Errors, r.Details)
	require.Equal(t, smallWallet.Operations+smallWallet.Transfers, r.Acknowledged+r.Declined)
	require.Equal(t, r.Expected, r.Actual)
	require.Equal(t, 0, r.Anomalies)
}

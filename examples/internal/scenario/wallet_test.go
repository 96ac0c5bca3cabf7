package scenario

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
)

// smallWallet keeps a run to a second or two on the embedded server.
var smallWallet = WalletConfig{Wallets: 3, Operations: 90, Transfers: 30, Concurrency: 6, Opening: 2000, MaxAmount: 800, Seed: 7}

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

func TestWalletTransfersNeedTransactions(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	_, err := RunWallet(t.Context(), db.Database, WithTransfers(WalletNaive), false, smallWallet)
	require.ErrorIs(t, err, ErrNoTransactions, "without transactions the transfer is refused, never faked")
	count, err := db.Collection("wallets_transfer_in_a_transaction").CountDocuments(t.Context(), map[string]any{})
	require.NoError(t, err)
	require.Zero(t, count, "nothing was written")
}

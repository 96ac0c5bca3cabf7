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

// TestFallbackKeepsEveryBalanceExact: four instances, each with a client of
// its own, change the same wallets at once; a change whose retries run out
// is queued and applied later. Every wallet ends at its opening balance plus
// the changes accepted, applied now or later.
func TestFallbackKeepsEveryBalanceExact(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	cfg := small
	cfg.URI = db.Server.URI
	r, err := scenario.RunWallet(t.Context(), db.Database, fallback, db.Caps().Transactions, cfg)
	require.NoError(t, err)
	require.Equal(t, 0, r.Errors, r.Details)
	require.Equal(t, small.Operations, r.Acknowledged+r.Declined)
	require.Equal(t, r.Queued, r.QueuedApplied+r.QueuedDeclined, "every queued change ended")
	require.Equal(t, r.Expected, r.Actual, "balance = opening + accepted deltas, wallet by wallet")
	require.Equal(t, 0, r.Anomalies)
	t.Logf("fallback: %s", strings.Join(r.Details, "; "))
}

// TestChangeLaterQueuesWhenBusy: another instance changes the wallet between
// this one's read and its write, and the retries run out: the change is
// queued, and its outcome is "applied", once.
func TestChangeLaterQueuesWhenBusy(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	ctx := t.Context()
	f := db.Faulty(t, nil) // this instance's client
	w, err := newQueueingWallets(f.Collection("wallets"), nil)
	require.NoError(t, err)
	defer w.Close()
	other, err := newWallets(db.Collection("wallets"), nil) // another instance
	require.NoError(t, err)
	require.NoError(t, w.Create(ctx, "ana", "Ana", 100))
	writes := mongotest.Writes("wallets")
	busy := 0
	f.ErrorBeforeApply(func(c *mongotest.Command) bool {
		if writes(c) && busy < 3 { // each of the 3 attempts meets another change
			busy++
			require.NoError(t, other.Change(ctx, "ana", 1))
		}
		return false
	}, mongotest.ServerError{})
	job, err := w.ChangeLater(ctx, "ana", -50)
	require.NoError(t, err)
	require.NotEmpty(t, job, "queued")
	require.NoError(t, w.Outcome(ctx, job))
	got, err := other.repo.Get(ctx, "ana")
	require.NoError(t, err)
	require.Equal(t, int64(100+3-50), got.Balance, "applied once")

	job, err = w.ChangeLater(ctx, "ana", -10)
	require.NoError(t, err)
	require.Empty(t, job, "applied now")
	_, err = w.ChangeLater(ctx, "ana", -1000)
	require.ErrorIs(t, err, errInsufficientFunds)
	_, err = w.ChangeLater(ctx, "bob", 1)
	require.ErrorIs(t, err, versioned.ErrNotFound)
}

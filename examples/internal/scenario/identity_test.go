package scenario

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
)

// smallIdentity keeps a run to a second or two: short partner latencies,
// and a fifth of the calls failing so that retries are exercised.
var smallIdentity = IdentityConfig{Users: 4, Switches: 3, LatencyMin: 5 * time.Millisecond, LatencyMax: 15 * time.Millisecond, FailureRate: 0.2, Seed: 7}

func TestIdentityNoLockAccounting(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	r, err := RunIdentity(t.Context(), db.Database, IdentityNoLock, false, smallIdentity)
	require.NoError(t, err)
	require.Equal(t, KindNaive, r.Kind)
	require.Equal(t, r.Requests, r.Done+r.Failed)
	require.Equal(t, r.Failed, r.Errors)
	require.LessOrEqual(t, r.Corrupted, smallIdentity.Users)
	require.Equal(t, 0, r.DoubleClicks)
	require.Equal(t, r.Partner.Interleaved+r.Corrupted, r.Anomalies)
	t.Logf("no lock: %s", strings.Join(r.Details, "; "))
}

func TestIdentityTransactionAcrossHTTP(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	if !db.Caps().Transactions {
		// A pass of its own, not hidden behind the skip below.
		t.Run("refused without transactions", func(t *testing.T) {
			_, err := RunIdentity(t.Context(), db.Database, IdentityTxAcrossHTTP, false, smallIdentity)
			require.ErrorIs(t, err, ErrNoTransactions)
		})
	}
	db.Require(t, mongotest.Transactions)
	r, err := RunIdentity(t.Context(), db.Database, IdentityTxAcrossHTTP, true, smallIdentity)
	require.NoError(t, err)
	require.Equal(t, KindAntiPattern, r.Kind)
	require.Equal(t, r.Requests, r.Done+r.Failed)
	require.GreaterOrEqual(t, r.TxAttempts, int64(r.Requests))
	require.Positive(t, r.TxMaxOpen)
	t.Logf("tx: %s", strings.Join(r.Details, "; "))
}

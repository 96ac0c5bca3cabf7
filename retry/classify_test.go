package retry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"

	"github.com/mongocas/mongocas/retry"
)

var (
	errNetwork       = mongo.CommandError{Code: 6, Name: "HostUnreachable", Message: "connection reset", Labels: []string{"NetworkError"}}
	errWriteConflict = mongo.CommandError{Code: 112, Name: "WriteConflict", Message: "write conflict"}
	errRetryableWr   = mongo.CommandError{Code: 91, Name: "ShutdownInProgress", Message: "shutting down", Labels: []string{"RetryableWriteError"}}
	errTransientTxn  = mongo.CommandError{Code: 251, Name: "NoSuchTransaction", Labels: []string{"TransientTransactionError"}}
	errMaxTime       = mongo.CommandError{Code: 50, Name: "MaxTimeMSExpired", Message: "operation exceeded time limit"}
	errDuplicateKey  = mongo.CommandError{Code: 11000, Name: "DuplicateKey", Message: "E11000 duplicate key error"}
)

func TestIsRetryable(t *testing.T) {
	t.Parallel()
	notRetryable := &retryableError{retry: false, err: errors.New("needs a re-read")}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", errBoom, false},
		{"canceled", context.Canceled, false},
		{"deadline", context.DeadlineExceeded, false},
		{"wrapped canceled", fmt.Errorf("find: %w", context.Canceled), false},
		{"wrapped deadline", fmt.Errorf("find: %w", context.DeadlineExceeded), false},
		{"canceled network error", mongo.CommandError{Labels: []string{"NetworkError"}, Wrapped: context.Canceled}, false},
		{"deadline would be exceeded", fmt.Errorf("update: %w", driver.ErrDeadlineWouldBeExceeded), false},

		{"Retryable true", errConflict, true},
		{"Retryable true wrapped", fmt.Errorf("save: %w", errConflict), true},
		{"Retryable true wrapped twice", fmt.Errorf("repo: %w", fmt.Errorf("save: %w", errConflict)), true},
		{"Retryable true joined", errors.Join(errBoom, errConflict), true},
		{"Retryable true joined and wrapped", fmt.Errorf("x: %w", errors.Join(errBoom, fmt.Errorf("y: %w", errConflict))), true},
		{"Retryable false", notRetryable, false},
		{"Retryable false overrides the transient error it wraps", &retryableError{retry: false, err: errNetwork}, false},

		{"network", errNetwork, true},
		{"network wrapped", fmt.Errorf("update: %w", errNetwork), true},
		{"network joined", errors.Join(errBoom, errNetwork), true},
		{"write conflict", errWriteConflict, true},
		{"RetryableWriteError label", errRetryableWr, true},
		{"TransientTransactionError label", errTransientTxn, true},
		{"MaxTimeMSExpired", errMaxTime, true},
		{"duplicate key", errDuplicateKey, false},

		{"Permanent", retry.Permanent(errBoom), false},
		{"Permanent network", retry.Permanent(errNetwork), false},
		{"Permanent Retryable", retry.Permanent(errConflict), false},
		{"wrapped Permanent", fmt.Errorf("x: %w", retry.Permanent(errNetwork)), false},
		{"joined Permanent", errors.Join(retry.Permanent(errBoom), errConflict), false},

		{"ExhaustedError", &retry.ExhaustedError{Attempts: 3, Last: errNetwork}, false},
		{"BudgetExhaustedError", &retry.BudgetExhaustedError{Attempts: 3, Last: errConflict}, false},
		{"sentinel ErrExhausted", retry.ErrExhausted, false},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, retry.IsRetryable(tc.err), tc.name)
	}
}

func TestPermanent(t *testing.T) {
	t.Parallel()
	require.NoError(t, retry.Permanent(nil))

	err := retry.Permanent(errNetwork)
	require.Equal(t, errNetwork.Error(), err.Error())
	require.ErrorIs(t, retry.Permanent(errBoom), errBoom)
	// mongo.CommandError holds a slice, so it is not comparable: errors.As reaches it.
	var ce mongo.CommandError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int32(6), ce.Code)
	require.True(t, retry.IsPermanent(err))
	require.True(t, retry.IsPermanent(fmt.Errorf("x: %w", err)))
	require.False(t, retry.IsPermanent(errNetwork))
	require.False(t, retry.IsPermanent(nil))
}

func TestTypedErrors(t *testing.T) {
	t.Parallel()
	ex := &retry.ExhaustedError{Attempts: 3, Elapsed: 12 * ms, Last: fmt.Errorf("save: %w", errConflict)}
	require.ErrorIs(t, ex, retry.ErrExhausted)
	require.ErrorIs(t, ex, errConflict)
	require.NotErrorIs(t, ex, retry.ErrBudgetExhausted)
	require.Equal(t, "retry: gave up after 3 attempts in 12ms: save: retryable(version conflict)", ex.Error())
	var re *retryableError
	require.ErrorAs(t, ex, &re)

	be := &retry.BudgetExhaustedError{Attempts: 2, Last: errNetwork}
	require.ErrorIs(t, be, retry.ErrBudgetExhausted)
	var ce mongo.CommandError
	require.ErrorAs(t, be, &ce)
	require.True(t, ce.HasErrorLabel("NetworkError"))
	require.NotErrorIs(t, be, retry.ErrExhausted)
	require.Equal(t, "retry: retry budget exhausted after 2 attempts: (HostUnreachable) connection reset", be.Error())

	cfg := &retry.ConfigError{Field: "Multiplier", Reason: "0.5 is below 1"}
	require.ErrorIs(t, cfg, retry.ErrInvalidPolicy)
	require.Equal(t, "retry: invalid policy: Multiplier: 0.5 is below 1", cfg.Error())
}

package retry_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/retry"
)

func TestDefault(t *testing.T) {
	t.Parallel()
	require.Equal(t, retry.Policy{
		InitialInterval: 5 * ms,
		MaxInterval:     200 * ms,
		Multiplier:      2,
		Jitter:          retry.FullJitter,
		MaxAttempts:     10,
		MaxElapsedTime:  2 * time.Second,
	}, retry.Default())
	require.NoError(t, retry.Default().Validate())
	require.NoError(t, retry.Policy{}.Validate())
}

func TestValidate(t *testing.T) {
	t.Parallel()
	valid := []retry.Policy{
		{},
		retry.Default(),
		{Multiplier: 1},
		{MaxAttempts: -1, MaxElapsedTime: -1},
		{InitialInterval: time.Hour},
		{MaxInterval: time.Nanosecond},
		{InitialInterval: 7 * ms, MaxInterval: 7 * ms},
		{Jitter: retry.DecorrelatedJitter},
		{Budget: retry.NewBudget(0, 0)},
		{Budget: retry.NewBudget(1e12, 1)},
	}
	for i, p := range valid {
		require.NoError(t, p.Validate(), "valid[%d]", i)
	}

	invalid := []struct {
		field string
		p     retry.Policy
	}{
		{"InitialInterval", retry.Policy{InitialInterval: -1}},
		{"MaxInterval", retry.Policy{MaxInterval: -time.Second}},
		{"MaxInterval", retry.Policy{InitialInterval: 2 * ms, MaxInterval: ms}},
		{"Multiplier", retry.Policy{Multiplier: 0.5}},
		{"Multiplier", retry.Policy{Multiplier: -2}},
		{"Multiplier", retry.Policy{Multiplier: math.NaN()}},
		{"Multiplier", retry.Policy{Multiplier: math.Inf(1)}},
		{"Jitter", retry.Policy{Jitter: retry.DecorrelatedJitter + 1}},
		{"Jitter", retry.Policy{Jitter: -1}},
		{"Budget", retry.Policy{Budget: retry.NewBudget(-1, 3)}},
		{"Budget", retry.Policy{Budget: retry.NewBudget(math.NaN(), 3)}},
		{"Budget", retry.Policy{Budget: retry.NewBudget(math.Inf(1), 3)}},
		{"Budget", retry.Policy{Budget: retry.NewBudget(1, -1)}},
	}
	for _, tc := range invalid {
		err := tc.p.Validate()
		require.ErrorIs(t, err, retry.ErrInvalidPolicy, tc.field)
		var ce *retry.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, tc.field, ce.Field)
		require.NotEmpty(t, ce.Reason)

		// Do reports the same error and never calls fn.
		fn, calls := counter(nil)
		doErr := retry.Do(context.Background(), tc.p, fn)
		require.Equal(t, err, doErr)
		require.Zero(t, calls(), tc.field)

		_, doErr = retry.DoValue(context.Background(), tc.p, func(context.Context) (int, error) {
			t.Fatal("fn called with an invalid policy")
			return 0, nil
		})
		require.ErrorIs(t, doErr, retry.ErrInvalidPolicy)
	}
}

package scenario

import (
	"cmp"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/retry"
)

func TestPartnerDetectsInterleavingFencesAndReplays(t *testing.T) {
	t.Parallel()
	p := NewPartner(PartnerConfig{LatencyMin: 30 * time.Millisecond, LatencyMax: 30 * time.Millisecond})
	defer p.Close()
	c := p.Client(retry.Policy{MaxAttempts: 1})
	defer c.Close()
	ctx := t.Context()
	p.AddUser("u", []string{"a", "b", "c"})

	// Two switches at once: both unlink from a, then both link.
	errs := make(chan error, 2)
	for _, s := range []struct{ target, seq string }{{"b", "s1"}, {"c", "s2"}} {
		go func() { errs <- c.SwitchPrimary(withSequence(ctx, s.seq), "u", "a", s.target, s.seq, 0) }()
	}
	e1, e2 := <-errs, <-errs
	require.NotEqual(t, e1 == nil, e2 == nil, "one link finds a no longer primary: %v, %v", e1, e2)
	require.True(t, isPartnerConflict(cmp.Or(e1, e2)))
	st := p.Stats()
	require.Equal(t, 2, st.Interleaved)
	require.Equal(t, 1, st.InterleavedUsers)
	require.Len(t, p.Primaries("u"), 2, "the account is split in two")

	// Fencing: a token older than one seen is refused.
	p.AddUser("v", []string{"a", "b", "c"})
	require.NoError(t, c.SwitchPrimary(withSequence(ctx, "t1"), "v", "a", "b", "v/7", 7))
	err := c.SwitchPrimary(withSequence(ctx, "t2"), "v", "b", "c", "v/6", 6)
	require.True(t, isPartnerConflict(err), "%v", err)
	require.Equal(t, st.StaleTokens+1, p.Stats().StaleTokens, "t2's first call is refused, and t2 stops there")
	require.Equal(t, []string{"b"}, p.Primaries("v"))

	// Idempotency: the same key is answered from the store, not applied again.
	require.NoError(t, c.Do(ctx, call{op: "unlink", user: "v", primary: "b", secondary: "c", seq: "t3", key: "v/8/unlink", token: 8}))
	require.NoError(t, c.Do(ctx, call{op: "unlink", user: "v", primary: "b", secondary: "c", seq: "t3", key: "v/8/unlink", token: 8}))
	require.Equal(t, int64(1), p.Stats().Replayed)
	err = c.Do(ctx, call{op: "unlink", user: "v", primary: "b", secondary: "c", seq: "t4", key: "v/9/unlink", token: 9})
	var pe *PartnerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, http.StatusConflict, pe.Status, "a new key is applied, and c is no longer linked")
}

func TestPartnerFailuresAreRetried(t *testing.T) {
	t.Parallel()
	p := NewPartner(PartnerConfig{LatencyMin: time.Millisecond, LatencyMax: time.Millisecond, FailureRate: 0.5, Seed: 3})
	defer p.Close()
	c := p.Client(retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, MaxAttempts: 30})
	defer c.Close()
	for u := range 10 {
		user := "u" + string(rune('0'+u))
		p.AddUser(user, []string{"a", "b"})
		require.NoError(t, c.SwitchPrimary(withSequence(t.Context(), user), user, "a", "b", user, 1))
		require.Equal(t, []string{"b"}, p.Primaries(user), "each call applied exactly once despite lost replies")
	}
	st := p.Stats()
	require.Positive(t, st.Failed)
	require.Equal(t, st.Failed, c.Retries())
	require.Positive(t, st.Replayed, "a lost reply's retry is answered from the idempotency store")
}

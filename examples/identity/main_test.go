package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/examples/internal/scenario"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
)

func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

func TestLeaseNeverInterleaves(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	// Short partner latencies, and a fifth of the calls failing so that
	// retries are exercised.
	cfg := scenario.IdentityConfig{Users: 4, Switches: 3, LatencyMin: 5 * time.Millisecond, LatencyMax: 15 * time.Millisecond, FailureRate: 0.2, Seed: 7}
	r, err := scenario.RunIdentity(t.Context(), db.Database, service, db.Caps().Transactions, cfg)
	require.NoError(t, err)
	require.Equal(t, scenario.KindMongocas, r.Kind)
	require.Equal(t, 0, r.Failed, r.Details)
	require.Equal(t, cfg.Users*cfg.Switches, r.Done)
	require.Equal(t, 0, r.Partner.Interleaved, "no two switches of a user overlap at the partner")
	require.Equal(t, 0, r.Corrupted, "every user ends with one primary, the one the database holds")
	require.Equal(t, int64(0), r.Partner.StaleTokens)
	require.Equal(t, cfg.Users, r.DoubleClicks, "one double click per user")
	require.Equal(t, r.DoubleClicks, r.DoubleClickHeld, "every double click got ErrHeld")
	require.Positive(t, r.DoubleClickTimeLeft)
	require.NotEmpty(t, r.DoubleClickHolder)
	require.NotNil(t, r.Retry, "the service serves the switch over HTTP with idempotency keys")
	require.Equal(t, cfg.Users, r.Retry.Clients)
	require.Equal(t, cfg.Users, r.Retry.Replayed, "every late retry got its first answer back")
	require.Zero(t, r.Retry.SwitchedTwice)
	require.Empty(t, r.Retry.Failures)
	require.Equal(t, 0, r.Anomalies)
	t.Logf("lease: %s", strings.Join(r.Details, "; "))
}

// TestRetryAfterTimeoutNeverSwitchesTwice: a client asks to make u-id1 the
// primary and gives up before the answer; it retries with the same
// Idempotency-Key and gets 200. Then another request switches the user to
// u-id2. The first client's retry, arriving once more, gets its first
// answer back (replayed) and the user stays on u-id2. The same retry made
// without the key switches the user back: what the key is for.
func TestRetryAfterTimeoutNeverSwitchesTwice(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	ctx := t.Context()
	p := scenario.NewPartner(scenario.PartnerConfig{LatencyMin: 30 * time.Millisecond, LatencyMax: 30 * time.Millisecond})
	defer p.Close()
	c := p.Client(retry.Policy{MaxAttempts: 1})
	defer c.Close()
	s, err := newIdentities(db.Collection("users"), c, "instance-a", 5*time.Second, nil)
	require.NoError(t, err)
	ids := []string{"u-id0", "u-id1", "u-id2"}
	p.AddUser("u", ids)
	require.NoError(t, s.AddUser(ctx, "u", ids))
	h, err := s.Handler()
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	post := func(key, identity string, timeout time.Duration) (int, http.Header, error) {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, srv.URL+"/users/u/primary", strings.NewReader(identity))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header, nil
	}
	// until retries while the switch runs (409) or failed transiently (503).
	until := func(key, identity string) (int, http.Header) {
		for {
			status, header, err := post(key, identity, 10*time.Second)
			require.NoError(t, err)
			if status != http.StatusConflict && status != http.StatusServiceUnavailable {
				return status, header
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	_, _, err = post("7d1c-switch-to-id1", "u-id1", 10*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a switch takes two partner calls of 30ms")
	status, _ := until("7d1c-switch-to-id1", "u-id1")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, []string{"u-id1"}, p.Primaries("u"))

	status, header := until("9e2f-switch-to-id2", "u-id2")
	require.Equal(t, http.StatusOK, status)
	require.Empty(t, header.Get("Idempotent-Replayed"))

	status, header = until("7d1c-switch-to-id1", "u-id1")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "true", header.Get("Idempotent-Replayed"), "the late retry gets its first answer")
	u, err := s.users.Get(ctx, "u")
	require.NoError(t, err)
	require.Equal(t, "u-id2", u.Primary, "and switches nothing")
	require.Equal(t, []string{"u-id2"}, p.Primaries("u"))

	// Without a key, the same late retry is a second switch.
	require.NoError(t, s.Switch(ctx, "u", "u-id1"))
	u, err = s.users.Get(ctx, "u")
	require.NoError(t, err)
	require.Equal(t, "u-id1", u.Primary)
}

func TestSwitchNowAnswersAtOnce(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	ctx := t.Context()
	p := scenario.NewPartner(scenario.PartnerConfig{LatencyMin: time.Millisecond, LatencyMax: time.Millisecond})
	defer p.Close()
	c := p.Client(retry.Policy{MaxAttempts: 1})
	defer c.Close()
	users := db.Collection("users")
	a, err := newIdentities(users, c, "instance-a", 5*time.Second, nil)
	require.NoError(t, err)
	b, err := newIdentities(users, c, "instance-b", 5*time.Second, nil)
	require.NoError(t, err)
	ids := []string{"u-id0", "u-id1", "u-id2"}
	p.AddUser("u", ids)
	require.NoError(t, a.AddUser(ctx, "u", ids))

	require.NoError(t, a.SwitchNow(ctx, "u", "u-id1"), "nobody else is switching")
	require.Equal(t, []string{"u-id1"}, p.Primaries("u"))

	l, err := a.leases.TryAcquire(ctx, "u") // a switch on instance a is running
	require.NoError(t, err)
	err = b.SwitchNow(ctx, "u", "u-id2")
	held, ok := errors.AsType[*lease.HeldError](err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "instance-a", held.Owner)
	require.Positive(t, held.TimeLeft)
	require.NoError(t, l.Release(ctx))

	require.NoError(t, b.Switch(ctx, "u", "u-id2"))
	u, err := b.users.Get(ctx, "u")
	require.NoError(t, err)
	require.Equal(t, "u-id2", u.Primary)
	require.Equal(t, []string{"u-id2"}, p.Primaries("u"))
}

package main

import (
	"errors"
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
	require.Equal(t, 0, r.Anomalies)
	t.Logf("lease: %s", strings.Join(r.Details, "; "))
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
	a, err := newIdentities(users, c, "instance-a", 5*time.Second)
	require.NoError(t, err)
	b, err := newIdentities(users, c, "instance-b", 5*time.Second)
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

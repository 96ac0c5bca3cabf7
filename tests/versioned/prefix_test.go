package versioned_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/versioned"
)

// requireOnePrefix fails unless err's message names each package at most
// once: "versioned: get x: document not found", never
// "versioned: get x: versioned: document not found".
func requireOnePrefix(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	msg := err.Error()
	for _, p := range []string{"lease: ", "versioned: ", "store: ", "retry: ", "mongotest: "} {
		require.LessOrEqual(t, strings.Count(msg, p), 1, "prefix %q repeats in %q", p, msg)
	}
}

// TestErrorsSayTheirPrefixOnce triggers the errors each entry point returns
// before and after reaching the server, and checks each message's prefix.
func TestErrorsSayTheirPrefixOnce(t *testing.T) {
	t.Parallel()
	repo, b := setup[item](t, nil)
	ctx := b.ctx
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	bad := bson.D{{Key: "$gt", Value: ""}}

	_, err := repo.Get(ctx, "nothing")
	require.ErrorIs(t, err, versioned.ErrNotFound)
	requireOnePrefix(t, err)
	_, err = repo.Get(ctx, bad)
	require.ErrorIs(t, err, versioned.ErrInvalid)
	requireOnePrefix(t, err)
	_, err = repo.Get(cancelled, "x")
	require.ErrorIs(t, err, context.Canceled)
	requireOnePrefix(t, err)

	require.NoError(t, repo.Insert(ctx, &item{SKU: "s", Stock: 1}))
	err = repo.Insert(ctx, &item{SKU: "s", Stock: 1})
	require.ErrorIs(t, err, versioned.ErrDuplicate)
	requireOnePrefix(t, err)
	err = repo.Update(ctx, &item{SKU: "s", Stock: 2, Version: 7})
	require.ErrorIs(t, err, versioned.ErrConflict)
	requireOnePrefix(t, err)
	_, err = repo.Guarded(ctx, "s", bson.D{{Key: "stock", Value: bson.D{{Key: "$gte", Value: 5}}}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -5}}}})
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	requireOnePrefix(t, err)
	_, err = repo.Modify(ctx, "missing", func(*item) error { return nil })
	require.ErrorIs(t, err, versioned.ErrNotFound)
	requireOnePrefix(t, err)
	_, err = repo.Guarded(ctx, "s", nil, bson.D{{Key: "$set", Value: bson.D{{Key: "version", Value: 9}}}})
	require.ErrorIs(t, err, versioned.ErrInvalid)
	requireOnePrefix(t, err)
}

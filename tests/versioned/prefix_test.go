package versioned_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/tests/internal/errmsg"
	"github.com/mongocas/mongocas/versioned"
)

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
	errmsg.RequireOnePrefix(t, err)
	_, err = repo.Get(ctx, bad)
	require.ErrorIs(t, err, versioned.ErrInvalid)
	errmsg.RequireOnePrefix(t, err)
	_, err = repo.Get(cancelled, "x")
	require.ErrorIs(t, err, context.Canceled)
	errmsg.RequireOnePrefix(t, err)

	require.NoError(t, repo.Insert(ctx, &item{SKU: "s", Stock: 1}))
	err = repo.Insert(ctx, &item{SKU: "s", Stock: 1})
	require.ErrorIs(t, err, versioned.ErrDuplicate)
	errmsg.RequireOnePrefix(t, err)
	err = repo.Update(ctx, &item{SKU: "s", Stock: 2, Version: 7})
	require.ErrorIs(t, err, versioned.ErrConflict)
	errmsg.RequireOnePrefix(t, err)
	_, err = repo.Guarded(ctx, "s", bson.D{{Key: "stock", Value: bson.D{{Key: "$gte", Value: 5}}}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -5}}}})
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	errmsg.RequireOnePrefix(t, err)
	_, err = repo.Modify(ctx, "missing", func(*item) error { return nil })
	require.ErrorIs(t, err, versioned.ErrNotFound)
	errmsg.RequireOnePrefix(t, err)
	_, err = repo.Guarded(ctx, "s", nil, bson.D{{Key: "$set", Value: bson.D{{Key: "version", Value: 9}}}})
	require.ErrorIs(t, err, versioned.ErrInvalid)
	errmsg.RequireOnePrefix(t, err)
}

package versioned_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// leased maps the reserved lease field, to read it.
type leased struct {
	ID      string `bson:"_id"`
	N       int64  `bson:"n"`
	Lease   bson.M `bson:"_lease,omitempty"`
	Version int64  `bson:"version"`
}

var errLost = errors.New("lease lost")

// A fenced write whose fence no longer holds fails with the fence's error,
// even when the version moved too: the caller's lease is gone, and retrying
// would not help, so retry.Do must not retry it.
func TestFailedWhereWinsOverVersion(t *testing.T) {
	t.Parallel()
	repo, b := setup[leased](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &leased{ID: "d"}))
	held, err := repo.Get(b.ctx, "d")
	require.NoError(t, err)
	fence := versioned.WhereErr(bson.D{{Key: "_lease.owner", Value: "me"}}, errLost)
	// Someone else takes the lease and writes: the version moves too.
	_, err = b.coll.UpdateOne(b.ctx, bson.M{"_id": "d"}, bson.M{"$set": bson.M{"_lease.owner": "other"}, "$inc": bson.M{"version": 1}})
	require.NoError(t, err)

	held.N = 5
	err = repo.Update(b.ctx, held, fence)
	require.ErrorIs(t, err, errLost)
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	require.NotErrorIs(t, err, versioned.ErrConflict)
	require.False(t, retry.IsRetryable(err))

	calls := 0
	_, err = repo.Modify(b.ctx, "d", func(l *leased) error { calls++; l.N++; return nil }, fence)
	require.ErrorIs(t, err, errLost)
	require.Zero(t, calls)

	attempts := 0
	err = retry.Do(b.ctx, retry.Policy{}, func(ctx context.Context) error { attempts++; return repo.Delete(ctx, held, fence) })
	require.ErrorIs(t, err, errLost)
	require.Equal(t, 1, attempts, "not retried")
	require.Equal(t, int64(0), b.raw(t, "d")["n"], "nothing written")
}

// Reserved fields (the lease record by default): Guarded refuses a path in
// them, Modify a fn that changes them, and Update never writes them, even
// when T maps them. Nothing is sent.
func TestReservedFields(t *testing.T) {
	t.Parallel()
	repo, b := setup[leased](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &leased{ID: "r"}))
	_, err := b.coll.UpdateOne(b.ctx, bson.M{"_id": "r"}, bson.M{"$set": bson.M{"_lease": bson.M{"owner": "x", "epoch": int64(7)}}})
	require.NoError(t, err)
	before := b.rawBytes(t, "r")

	_, err = repo.Guarded(b.ctx, "r", nil, bson.M{"$inc": bson.M{"_lease.epoch": -5}})
	require.ErrorIs(t, err, versioned.ErrInvalid)
	_, err = repo.Modify(b.ctx, "r", func(l *leased) error { l.Lease["epoch"] = int64(2); return nil })
	require.ErrorIs(t, err, versioned.ErrInvalid)
	var ie *versioned.InvalidError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "_lease", ie.Field)
	require.Equal(t, before, b.rawBytes(t, "r"), "nothing was written")

	held, err := repo.Get(b.ctx, "r")
	require.NoError(t, err)
	require.Equal(t, "x", held.Lease["owner"], "T may read a reserved field")
	held.Lease = nil
	held.N = 3
	require.NoError(t, repo.Update(b.ctx, held))
	m := b.raw(t, "r")
	require.Equal(t, int64(3), m["n"])
	require.Equal(t, bson.M{"owner": "x", "epoch": int64(7)}, m["_lease"], "Update left the reserved field alone")

	// An empty Reserved reserves nothing.
	open, err := versioned.New[leased](b.coll, &versioned.Options{Reserved: []string{}})
	require.NoError(t, err)
	_, err = open.Guarded(b.ctx, "r", nil, bson.M{"$set": bson.M{"_lease.owner": "y"}})
	require.NoError(t, err)
}

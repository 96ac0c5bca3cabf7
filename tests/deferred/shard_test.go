package deferred_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/tests/internal/shardtest"
	"github.com/mongocas/mongocas/versioned"
)

// regional is a target document of a collection sharded on a compound key
// of region and accountId (shardtest.ShardKey).
type regional struct {
	ID        string `bson:"_id"`
	Region    string `bson:"region"`
	AccountID int64  `bson:"accountId"`
	Balance   int64  `bson:"balance"`
	Version   int64  `bson:"version"`
}

// TestHelpersSendTheShardKey: Modify and Guarded on a repository with
// Options.ShardKey send the shard key in every filter they use (the read,
// the write, the re-read that settles a lost reply, the read of a job
// applied earlier), and still apply each job once.
func TestHelpersSendTheShardKey(t *testing.T) {
	t.Parallel()
	key := shardtest.ShardKey(t)
	db := mongotest.New(t)
	key.Shard(t, db.Collection("regional"))
	capture, copts := shardtest.NewCapture("regional")
	f := db.Faulty(t, &mongotest.FaultyOptions{ClientOptions: copts})
	repo, err := versioned.New[regional](f.Collection("regional"), &versioned.Options{ShardKey: key.Fields})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	docs := map[string]*regional{
		"acct-1": {ID: "acct-1", Region: shardtest.Regions[0], AccountID: 1},
		"acct-2": {ID: "acct-2", Region: shardtest.Regions[1], AccountID: 2},
	}
	routes := shardtest.Routes{}
	for id, d := range docs {
		require.NoError(t, repo.Insert(ctx, d))
		routes[shardtest.RouteOf(t, id)] = key.Values(d.Region, d.AccountID)
	}
	capture.Take()
	keyOf := func(id string) versioned.Key {
		return versioned.Key{ID: id, Shard: key.Values(docs[id].Region, docs[id].AccountID)}
	}

	q, err := deferred.New(db.Collection("jobs"), fast(nil))
	require.NoError(t, err)
	var runs atomic.Int64
	errOnce := errors.New("fail after the write, once")
	modify, err := deferred.Register(q, "modify", func(ctx context.Context, job *deferred.Job, id string) error {
		_, err := deferred.Modify(ctx, job, repo, keyOf(id), func(d *regional) error { d.Balance += 10; return nil })
		if err == nil && runs.Add(1) == 1 {
			return errOnce // delivered again: the fence finds it applied
		}
		return err
	})
	require.NoError(t, err)
	guarded, err := deferred.Register(q, "guarded", func(ctx context.Context, job *deferred.Job, id string) error {
		_, err := deferred.Guarded(ctx, job, repo, keyOf(id), nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
		return err
	})
	require.NoError(t, err)
	stop := run(t, q)

	// The first write's reply is lost: versioned settles it by a re-read.
	fault := f.DropNextReply(mongotest.Writes("regional"))
	j1 := enqueue(t, ctx, modify, "acct-1", "acct-1")
	require.Equal(t, deferred.StateCompleted, wait(t, q, j1).State)
	require.True(t, fault.HasFired())
	require.Equal(t, int64(2), runs.Load(), "the handler ran twice")
	j2 := enqueue(t, ctx, guarded, "acct-2", "acct-2")
	require.Equal(t, deferred.StateCompleted, wait(t, q, j2).State)
	stop()

	for id, want := range map[string]int64{"acct-1": 10, "acct-2": 1} {
		got, err := repo.Get(ctx, keyOf(id))
		require.NoError(t, err)
		require.Equal(t, want, got.Balance, "%s: applied once", id)
	}
	cmds := capture.Take()
	names := shardtest.Names(cmds)
	require.Contains(t, names, "find")
	require.Contains(t, names, "update")
	require.Positive(t, shardtest.RequireTargeted(t, cmds, routes))
}

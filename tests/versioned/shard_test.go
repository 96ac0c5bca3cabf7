package versioned_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/tests/internal/shardtest"
	"github.com/mongocas/mongocas/versioned"
)

// regional is a document of a collection sharded on a compound key of
// region and accountId (shardtest.ShardKey).
type regional struct {
	ID        string `bson:"_id"`
	Region    string `bson:"region"`
	AccountID int64  `bson:"accountId"`
	Balance   int64  `bson:"balance"`
	Version   int64  `bson:"version"`
}

type shardBundle struct {
	key     shardtest.Key
	db      *mongotest.DB
	f       *mongotest.Faulty
	capture *shardtest.Capture
	repo    *versioned.Repo[regional] // through the fault proxy, captured
	other   *versioned.Repo[regional] // a second process's repository, not captured
	routes  shardtest.Routes
	checked int
}

func setupShard(t *testing.T) *shardBundle {
	t.Helper()
	key := shardtest.ShardKey(t)
	db := mongotest.New(t)
	key.Shard(t, db.Collection("docs"))
	capture, copts := shardtest.NewCapture("docs")
	f := db.Faulty(t, &mongotest.FaultyOptions{ClientOptions: copts})
	opts := &versioned.Options{ShardKey: key.Fields, Retry: retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond}}
	repo, err := versioned.New[regional](f.Collection("docs"), opts)
	require.NoError(t, err)
	other, err := versioned.New[regional](db.Collection("docs"), opts)
	require.NoError(t, err)
	return &shardBundle{key: key, db: db, f: f, capture: capture, repo: repo, other: other, routes: shardtest.Routes{}}
}

// doc makes a document and records its shard-key values as the route every
// filter on it must carry.
func (b *shardBundle) doc(t *testing.T, id, region string, account int64) *regional {
	t.Helper()
	b.routes[shardtest.RouteOf(t, id)] = b.key.Values(region, account)
	return &regional{ID: id, Region: region, AccountID: account, Balance: 100}
}

func (b *shardBundle) keyOf(d *regional) versioned.Key {
	return versioned.Key{ID: d.ID, Shard: b.key.Values(d.Region, d.AccountID)}
}

// step checks what the last operation sent: exactly the commands want
// names, in order, each filter routed to its document's shard.
func (b *shardBundle) step(t *testing.T, want ...string) {
	t.Helper()
	cmds := b.capture.Take()
	require.Equal(t, append([]string{}, want...), shardtest.Names(cmds), "commands sent")
	b.checked += shardtest.RequireTargeted(t, cmds, b.routes)
}

// TestShardKeyInEveryFilter drives every operation of a repository
// configured with a compound shard key, and every path that re-reads or
// sends again (conflicts, failed guards, a stale anchor, lost replies,
// write-concern errors, a write that never arrived), and checks that each
// command it sent filters on the _id and on an equality with each
// shard-key value: on a sharded cluster each goes to one shard. With
// MONGOCAS_SHARD_KEY set (the sharded-cluster CI job), the collection is
// sharded on the server, its two regions on two shards, and mongos's own
// counts must show no command sent to more than one shard.
func TestShardKeyInEveryFilter(t *testing.T) {
	b := setupShard(t)
	ctx := context.Background()
	before := b.key.ReadTargeting(t, b.db)
	eu, us := b.doc(t, "acct-1", shardtest.Regions[0], 1), b.doc(t, "acct-2", shardtest.Regions[1], 2)

	t.Run("insert", func(t *testing.T) {
		require.NoError(t, b.repo.Insert(ctx, eu))
		require.NoError(t, b.repo.Insert(ctx, us))
		b.step(t, "insert", "insert")
	})

	t.Run("get", func(t *testing.T) {
		got, err := b.repo.Get(ctx, b.keyOf(us))
		require.NoError(t, err)
		require.Equal(t, us.Version, got.Version)
		b.step(t, "find")
		other := b.keyOf(us)
		other.Shard = b.key.Values(shardtest.Regions[0], 2)
		_, err = b.repo.Get(ctx, other)
		require.ErrorIs(t, err, versioned.ErrNotFound, "another shard key names another document")
		require.Equal(t, []string{"find"}, shardtest.Names(b.capture.Take())) // routed by the Key's values, not the document's
	})

	t.Run("update", func(t *testing.T) {
		stale := *eu
		eu.Balance++
		require.NoError(t, b.repo.Update(ctx, eu))
		b.step(t, "update")
		stale.Balance = 7
		require.ErrorIs(t, b.repo.Update(ctx, &stale), versioned.ErrConflict)
		b.step(t, "update", "find")
		require.ErrorIs(t, b.repo.Update(ctx, eu, versioned.Where(bson.D{{Key: "balance", Value: -1}})), versioned.ErrGuardFailed)
		b.step(t, "update", "find", "find")
	})

	// Where the server runs update pipelines, Modify's write on a document
	// that conflicted lately is a findAndModify that returns the current
	// document on a conflict: the retry sends no read, and the final
	// re-read is not needed. Else it is an updateOne.
	pipes := b.db.Server.Caps.UpdatePipelines
	cas := "update"
	if pipes {
		cas = "findAndModify"
	}

	t.Run("modify", func(t *testing.T) {
		_, err := b.repo.Modify(ctx, b.keyOf(eu), func(d *regional) error { d.Balance++; return nil })
		require.NoError(t, err)
		b.step(t, "find", "update")

		// A conflict: another writer moves the document between the read
		// and the write, once; Modify reads and writes again.
		calls := 0
		_, err = b.repo.Modify(ctx, b.keyOf(eu), func(d *regional) error {
			calls++
			if calls == 1 {
				_, err := b.other.Guarded(ctx, b.keyOf(eu), nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
				require.NoError(t, err)
			}
			d.Balance += 10
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 2, calls)
		b.step(t, "find", "update", "find", cas) // the document is hot now

		// The retries run out: the final re-read reports the version.
		_, err = b.repo.Modify(ctx, b.keyOf(eu), func(d *regional) error {
			_, err := b.other.Guarded(ctx, b.keyOf(eu), nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
			require.NoError(t, err)
			d.Balance += 10
			return nil
		}, versioned.WithRetry(retry.Policy{MaxAttempts: 2, InitialInterval: time.Millisecond}))
		require.ErrorIs(t, err, versioned.ErrConflict)
		if pipes {
			b.step(t, "find", cas, cas)
		} else {
			b.step(t, "find", cas, "find", cas, "find")
		}

		// A failed guard on the read: a re-read tells it from a missing
		// document, and checks which guard failed.
		_, err = b.repo.Modify(ctx, b.keyOf(eu), func(*regional) error { return nil },
			versioned.WhereErr(bson.D{{Key: "balance", Value: -1}}, errNegative))
		require.ErrorIs(t, err, errNegative)
		b.step(t, "find", "find", "find")
	})

	t.Run("guarded", func(t *testing.T) {
		inc := bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -1}}}}
		cold, err := versioned.New[regional](b.f.Collection("docs"), &versioned.Options{ShardKey: b.key.Fields})
		require.NoError(t, err)
		_, err = cold.Guarded(ctx, b.keyOf(us), nil, inc)
		require.NoError(t, err)
		b.step(t, "find", "findAndModify") // a repository that has not seen it reads its anchor first
		_, err = b.repo.Guarded(ctx, b.keyOf(us), bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: 1}}}}, inc)
		require.NoError(t, err)
		b.step(t, "findAndModify")

		_, err = b.repo.Guarded(ctx, b.keyOf(us), bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: 1000}}}}, inc)
		require.ErrorIs(t, err, versioned.ErrGuardFailed)
		b.step(t, "findAndModify", "find")

		// More writes than a document keeps ids of land elsewhere: the
		// anchor is gone, Guarded re-reads and sends again.
		for range versioned.WriteIDs + 1 {
			_, err := b.other.Guarded(ctx, b.keyOf(us), nil, inc)
			require.NoError(t, err)
		}
		_, err = b.repo.Guarded(ctx, b.keyOf(us), nil, inc)
		require.NoError(t, err)
		b.step(t, "findAndModify", "find", "findAndModify")
	})

	t.Run("delete", func(t *testing.T) {
		tmp := b.doc(t, "acct-3", shardtest.Regions[1], 3)
		require.NoError(t, b.repo.Insert(ctx, tmp))
		stale := *tmp
		_, err := b.other.Modify(ctx, b.keyOf(tmp), func(d *regional) error { d.Balance++; return nil })
		require.NoError(t, err)
		b.capture.Take()
		require.ErrorIs(t, b.repo.Delete(ctx, &stale), versioned.ErrConflict)
		b.step(t, "delete", "find")
		fresh, err := b.repo.Get(ctx, b.keyOf(tmp))
		require.NoError(t, err)
		require.NoError(t, b.repo.Delete(ctx, fresh))
		b.step(t, "find", "delete")
	})

	t.Run("lost replies", func(t *testing.T) {
		writes := mongotest.Writes("docs")
		// Insert: the reply is lost, the re-read finds it.
		lost := b.doc(t, "acct-4", shardtest.Regions[0], 4)
		fault := b.f.DropNextReply(writes)
		require.NoError(t, b.repo.Insert(ctx, lost))
		require.True(t, fault.HasFired())
		b.step(t, "insert", "find")

		fault = b.f.DropNextReply(writes)
		lost.Balance++
		require.NoError(t, b.repo.Update(ctx, lost))
		require.True(t, fault.HasFired())
		b.step(t, "update", "find")

		fault = b.f.DropNextReply(writes)
		_, err := b.repo.Modify(ctx, b.keyOf(lost), func(d *regional) error { d.Balance++; return nil })
		require.NoError(t, err)
		require.True(t, fault.HasFired())
		b.step(t, "find", "update", "find")

		fault = b.f.ErrorAfterApply(writes, mongotest.NotWritablePrimary())
		_, err = b.repo.Guarded(ctx, b.keyOf(lost), nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
		require.NoError(t, err)
		require.True(t, fault.HasFired())
		b.step(t, "findAndModify", "find")

		// A write that never arrived: the re-read shows it has not landed,
		// so it is sent again (the same filter), and a late copy delivered
		// afterwards matches nothing.
		held := b.f.HoldNext(writes)
		cur, err := b.repo.Get(ctx, b.keyOf(lost))
		require.NoError(t, err)
		cur.Balance += 5
		require.NoError(t, b.repo.Update(ctx, cur))
		require.True(t, held.HasFired())
		b.step(t, "find", "update", "find", "update")
		reply, err := held.Deliver(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 0, reply.Lookup("n").AsInt64(), "the late copy matches nothing")

		fresh, err := b.repo.Get(ctx, b.keyOf(lost))
		require.NoError(t, err)
		fault = b.f.WriteConcernErrorNext(writes, mongotest.WriteConcernTimeout())
		require.NoError(t, b.repo.Delete(ctx, fresh))
		require.True(t, fault.HasFired())
		b.step(t, "find", "delete", "find")
	})

	t.Run("refused before anything is sent", func(t *testing.T) {
		_, err := b.repo.Get(ctx, eu.ID)
		require.ErrorIs(t, err, versioned.ErrInvalidID, "a bare id where a shard key is configured")
		_, err = b.repo.Get(ctx, versioned.Key{ID: eu.ID, Shard: bson.D{{Key: b.key.Fields[0], Value: bson.D{{Key: "$ne", Value: ""}}}}})
		require.ErrorIs(t, err, versioned.ErrInvalidID, "an operator as a shard-key value")

		moved := *eu
		moved.Region = "ap"
		moved.AccountID = 99
		err = b.repo.Update(ctx, &moved)
		require.ErrorIs(t, err, versioned.ErrInvalid, "Update would move the document to another shard")
		require.Contains(t, err.Error(), "transaction or a retryable write")

		for _, set := range []bson.D{{{Key: "region", Value: "ap"}}, {{Key: "accountId", Value: int64(99)}}} {
			_, err = b.repo.Guarded(ctx, b.keyOf(eu), nil, bson.D{{Key: "$set", Value: set}})
			if b.touches(set[0].Key) {
				require.ErrorIs(t, err, versioned.ErrInvalid, "Guarded may not write %s", set[0].Key)
			} else {
				require.NoError(t, err)
				b.capture.Take()
			}
		}
		b.step(t)

		_, err = b.repo.Modify(ctx, b.keyOf(eu), func(d *regional) error { d.Region, d.AccountID = "ap", 99; return nil })
		require.ErrorIs(t, err, versioned.ErrInvalid, "fn may not change the shard key")
		b.step(t, "find") // the read, no write

		_, err = versioned.New[regional](b.f.Collection("docs"), &versioned.Options{ShardKey: []string{"version"}})
		require.ErrorIs(t, err, versioned.ErrInvalid)
		_, err = versioned.New[regional](b.f.Collection("docs"), &versioned.Options{ShardKey: []string{"tenant"}})
		require.ErrorIs(t, err, versioned.ErrInvalid, "T does not map it")
		_, err = versioned.New[regional](b.f.Collection("docs"), &versioned.Options{ShardKey: []string{"region.$x"}})
		require.ErrorIs(t, err, versioned.ErrInvalid)
	})

	require.Greater(t, b.checked, 40, "filters checked")
	shardtest.RequireOneShard(t, before, b.key.ReadTargeting(t, b.db))
}

var errNegative = errors.New("balance is not -1")

// touches reports whether the shard key under test has field.
func (b *shardBundle) touches(field string) bool {
	return slices.Contains(b.key.Fields, field)
}

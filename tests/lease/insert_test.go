package lease_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/store"
)

// TestDoInsertHasOneWinner: eight owners insert one new document with the
// lease claimed in it, at once, for each of 20 ids. Exactly one runs its
// function; every other is told the document exists (a duplicate key) and
// wrote nothing.
func TestDoInsertHasOneWinner(t *testing.T) { eachMode(t, testDoInsertHasOneWinner) }

//nolint:thelper // the body of a test, run once per mode
func testDoInsertHasOneWinner(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ms := make([]*lease.Manager, 8)
	for i := range ms {
		ms[i] = b.manager(t, fmt.Sprintf("owner-%d", i), time.Minute, nil)
	}
	for n := range 20 {
		id := fmt.Sprintf("new-%02d", n)
		var runs, dups atomic.Int32
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, m := range ms {
			wg.Go(func() {
				<-start
				err := m.DoInsert(t.Context(), id, bson.D{{Key: "by", Value: i}}, func(context.Context, *lease.Lease) error {
					runs.Add(1)
					return nil
				})
				switch {
				case store.IsDuplicateKey(err):
					dups.Add(1)
				case err != nil:
					t.Errorf("%s: %v", id, err)
				}
			})
		}
		close(start)
		wg.Wait()
		require.Equal(t, int32(1), runs.Load(), "%s: functions run", id)
		require.Equal(t, len(ms)-1, int(dups.Load()), "%s: told it exists", id)
		var doc struct {
			Lease struct {
				Owner string `bson:"owner"`
				Epoch int64  `bson:"epoch"`
			} `bson:"_lease"`
		}
		require.NoError(t, b.coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: id}}).Decode(&doc))
		require.Empty(t, doc.Lease.Owner, "released")
		require.Positive(t, doc.Lease.Epoch)
	}
}

// TestReleaseWithWritesAndReleases: a last write under the lease and its
// release are one update. The fields are set, the lease is free at once for
// another owner, whose epoch is larger, and the first lease's fence matches
// nothing after it. A named lease refuses both calls.
func TestReleaseWithWritesAndReleases(t *testing.T) { eachMode(t, testReleaseWithWritesAndReleases) }

//nolint:thelper // the body of a test, run once per mode
func testReleaseWithWritesAndReleases(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := t.Context()
	m := b.manager(t, "a", time.Minute, nil)
	var first *lease.Lease
	require.NoError(t, m.DoInsert(ctx, "doc", bson.D{{Key: "n", Value: 0}}, func(ctx context.Context, l *lease.Lease) error {
		first = l
		return l.ReleaseWith(ctx, bson.D{{Key: "result", Value: "done"}})
	}))
	require.ErrorIs(t, first.Err(), lease.ErrReleased)
	var doc struct {
		Result string `bson:"result"`
	}
	require.NoError(t, b.coll.FindOne(ctx, bson.D{{Key: "_id", Value: "doc"}}).Decode(&doc))
	require.Equal(t, "done", doc.Result)

	l, err := b.manager(t, "b", time.Minute, nil).TryAcquire(ctx, "doc")
	require.NoError(t, err, "released: free at once")
	require.Greater(t, l.Epoch(), first.Epoch())
	res, err := b.coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: "doc"}}, first.Fence()...), bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}})
	require.NoError(t, err)
	require.Zero(t, res.MatchedCount, "the first lease's fence")
	require.NoError(t, l.Release(ctx))

	named := b.named(t, b.db.Collection("locks"), "c", time.Minute, nil)
	err = named.DoInsert(ctx, "name", bson.D{}, func(context.Context, *lease.Lease) error { return nil })
	require.ErrorIs(t, err, lease.ErrInvalid)
	require.NoError(t, named.Do(ctx, "name", func(ctx context.Context, l *lease.Lease) error {
		require.ErrorIs(t, l.ReleaseWith(ctx, bson.D{{Key: "x", Value: 1}}), lease.ErrInvalid)
		return nil
	}))
}

// TestInsertAndReleaseWithRefuseClashingFields: a field of DoInsert's
// document or ReleaseWith's $set that is empty, an operator, _id or under
// the lease field is ErrInvalid, and nothing is written: no document is
// inserted, and the lease stays held with its record as it was.
func TestInsertAndReleaseWithRefuseClashingFields(t *testing.T) {
	b := setup(t, lease.ModeAuto)
	ctx := t.Context()
	m := b.manager(t, "a", time.Minute, nil)
	bad := []bson.D{
		{{Key: "", Value: 1}},
		{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}},
		{{Key: "_id", Value: "other"}},
		{{Key: "_id.x", Value: 1}},
		{{Key: "_lease", Value: bson.D{{Key: "owner", Value: "z"}}}},
		{{Key: "ok", Value: 1}, {Key: "_lease.owner", Value: "z"}},
	}
	for i, d := range bad {
		runs := 0
		err := m.DoInsert(ctx, "doc", d, func(context.Context, *lease.Lease) error { runs++; return nil })
		require.ErrorIs(t, err, lease.ErrInvalid, "document %d", i)
		require.Zero(t, runs)
	}
	n, err := b.coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Zero(t, n, "nothing inserted")

	id := b.insert(t)
	l, err := m.TryAcquire(ctx, id)
	require.NoError(t, err)
	before := load(t, b.coll, id)
	for i, d := range bad {
		require.ErrorIs(t, l.ReleaseWith(ctx, d), lease.ErrInvalid, "set %d", i)
	}
	require.NoError(t, l.Err(), "still held")
	require.Equal(t, before, load(t, b.coll, id), "nothing written")
	require.NoError(t, l.Release(ctx))
}

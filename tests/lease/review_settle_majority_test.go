package lease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
)

// TestSettlingReadsUseMajority (review, item 3): a claim is applied but its
// reply carries a writeConcernError (not replicated in time); the re-read that settles it is sent with read concern
// majority (after a writeConcernError on a replica set, the old primary may
// show a claim that is later rolled back), and it settles the claim: the
// lease is held once. Both test backends accept read concern majority.
func TestSettlingReadsUseMajority(t *testing.T) { eachMode(t, testSettlingReadsUseMajority) }

//nolint:thelper // the body of a test, run once per mode
func testSettlingReadsUseMajority(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	f := b.db.Faulty(t, nil)
	a, id, _ := primed(t, b, f, nil)
	reads := recordReads(f, b.coll.Name())
	fault := f.WriteConcernErrorNext(mongotest.Commands([]string{"findAndModify"}, b.coll.Name()), mongotest.WriteConcernTimeout())
	l, err := a.TryAcquire(ctx, id)
	require.True(t, fault.HasFired())
	require.NoError(t, err, "the re-read found the claim applied")
	require.Equal(t, "a", owner(load(t, b.coll, id).Lease))
	require.NoError(t, l.Release(ctx))

	require.NotEmpty(t, reads(), "the claim was settled by a read")
	for _, body := range reads() {
		level, _ := body.Lookup("readConcern", "level").StringValueOK()
		require.Equal(t, "majority", level, "settling read %v", body)
	}
}

// TestSettlingReadsWithoutMajority (review, item 3): a server that refuses
// read concern majority (code 148, ReadConcernMajorityNotEnabled, injected
// on the first settling read) still has the claim settled: the Manager
// reads with the collection's read concern from then on.
func TestSettlingReadsWithoutMajority(t *testing.T) { eachMode(t, testSettlingReadsWithoutMajority) }

//nolint:thelper // the body of a test, run once per mode
func testSettlingReadsWithoutMajority(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	f := b.db.Faulty(t, nil)
	a, id, _ := primed(t, b, f, nil)
	refused := f.ErrorBeforeApply(mongotest.Commands([]string{"find", "aggregate"}, b.coll.Name()), mongotest.ServerError{
		Code: 148, CodeName: "ReadConcernMajorityNotEnabled", Errmsg: "Majority read concern requested, but it is not supported by the storage engine.",
	})
	reads := recordReads(f, b.coll.Name())
	fault := f.DropNextReply(mongotest.Commands([]string{"findAndModify"}, b.coll.Name()))
	l, err := a.TryAcquire(ctx, id)
	require.True(t, fault.HasFired())
	require.True(t, refused.HasFired())
	require.NoError(t, err, "the re-read without majority found the claim applied")
	require.Equal(t, "a", owner(load(t, b.coll, id).Lease))
	require.NoError(t, l.Release(ctx))

	got := reads()
	require.NotEmpty(t, got, "after the refused read, one without majority")
	_, err = got[len(got)-1].LookupErr("readConcern", "level")
	require.Error(t, err, "no read concern after the refusal: %v", got[len(got)-1])
}

// primed returns a document-lease Manager for owner "a" (TTL ten seconds
// unless opts says) whose traffic passes f, and a document it claimed and
// released once, with that claim's epoch: the record has an epoch, so a
// claim of it is one findAndModify in both modes (a fault on it hits the
// claim itself).
func primed(t *testing.T, b *bundle, f *mongotest.Faulty, opts *lease.Options) (*lease.Manager, bson.ObjectID, int64) {
	t.Helper()
	ctx := context.Background()
	ttl := 10 * time.Second
	if opts != nil && opts.TTL > 0 {
		ttl = opts.TTL
	}
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", ttl, opts)
	id := b.insert(t)
	l, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	return a, id, l.Epoch()
}

// recordReads records the bodies of the find and aggregate commands on
// collection that pass f (it never drops one), and returns them so far.
func recordReads(f *mongotest.Faulty, collection string) func() []bson.Raw {
	var (
		mu    sync.Mutex
		reads []bson.Raw
	)
	isRead := mongotest.Commands([]string{"find", "aggregate"}, collection)
	f.DropReplies(1, func(c *mongotest.Command) bool {
		if isRead(c) {
			mu.Lock()
			reads = append(reads, c.Body)
			mu.Unlock()
		}
		return false
	})
	return func() []bson.Raw {
		mu.Lock()
		defer mu.Unlock()
		return append([]bson.Raw(nil), reads...)
	}
}

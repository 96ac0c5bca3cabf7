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
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", 10*time.Second, nil)
	id := b.insert(t)
	// Claim and release once, so that the record has an epoch and the
	// dropped findAndModify is the claim itself in both modes.
	l, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))

	var (
		mu    sync.Mutex
		reads []bson.Raw
	)
	isRead := mongotest.Commands([]string{"find", "aggregate"}, b.coll.Name())
	f.DropReplies(1, func(c *mongotest.Command) bool { // records, never drops
		if isRead(c) {
			mu.Lock()
			reads = append(reads, c.Body)
			mu.Unlock()
		}
		return false
	})
	fault := f.WriteConcernErrorNext(mongotest.Commands([]string{"findAndModify"}, b.coll.Name()), mongotest.WriteConcernTimeout())
	l, err = a.TryAcquire(ctx, id)
	require.True(t, fault.HasFired())
	require.NoError(t, err, "the re-read found the claim applied")
	require.Equal(t, "a", owner(load(t, b.coll, id).Lease))
	require.NoError(t, l.Release(ctx))

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, reads, "the claim was settled by a read")
	for _, body := range reads {
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
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", 10*time.Second, nil)
	id := b.insert(t)
	l, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))

	isRead := mongotest.Commands([]string{"find", "aggregate"}, b.coll.Name())
	refused := f.ErrorBeforeApply(isRead, mongotest.ServerError{
		Code: 148, CodeName: "ReadConcernMajorityNotEnabled", Errmsg: "Majority read concern requested, but it is not supported by the storage engine.",
	})
	var (
		mu    sync.Mutex
		reads []bson.Raw
	)
	f.DropReplies(1, func(c *mongotest.Command) bool { // records, never drops
		if isRead(c) {
			mu.Lock()
			reads = append(reads, c.Body)
			mu.Unlock()
		}
		return false
	})
	fault := f.DropNextReply(mongotest.Commands([]string{"findAndModify"}, b.coll.Name()))
	l, err = a.TryAcquire(ctx, id)
	require.True(t, fault.HasFired())
	require.True(t, refused.HasFired())
	require.NoError(t, err, "the re-read without majority found the claim applied")
	require.Equal(t, "a", owner(load(t, b.coll, id).Lease))
	require.NoError(t, l.Release(ctx))

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, reads, "after the refused read, one without majority")
	_, err = reads[len(reads)-1].LookupErr("readConcern", "level")
	require.Error(t, err, "no read concern after the refusal: %v", reads[len(reads)-1])
}

package lease_test

// Lost and ambiguous replies: a claim, renewal or release the server
// applied whose reply was lost, or said only that the write concern failed.
// The Manager settles each by a re-read (read concern majority where the
// server has it) and never holds a lease twice nor leaves one stuck.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// TestDroppedReply: the server applies a claim, renewal or release but its
// reply is lost (a network error after the write). The lease re-reads and
// learns the truth: no stuck lease, no double holder.
func TestDroppedReply(t *testing.T) { eachMode(t, testDroppedReply) }

//nolint:thelper // the body of a test, run once per mode
func testDroppedReply(t *testing.T, mode lease.Mode) {
	// Far above the re-reads' ResolveTimeout (10s): every lease here is
	// still held when its check comes.
	const ttl = time.Minute
	ctx := context.Background()
	b := setup(t, mode)
	f := b.db.Faulty(t, nil)
	coll := f.Collection(b.coll.Name())
	a := b.managerOn(t, coll, "a", ttl, nil)
	c := b.manager(t, "c", ttl, nil)
	claims := mongotest.Commands([]string{"findAndModify"}, b.coll.Name())
	updates := mongotest.Commands([]string{"update"}, b.coll.Name())
	renewals := updates
	if mode == lease.ModeServer {
		// A renewal in ModeServer is a findAndModify: it returns the
		// server's time of the renewal.
		renewals = claims
	}

	t.Run("acquire applied", func(t *testing.T) {
		droppedClaim(t, f, a, c, b.coll, b.insert(t))
	})

	t.Run("acquire not applied", func(t *testing.T) {
		id := b.insert(t)
		lc, err := c.TryAcquire(ctx, id)
		require.NoError(t, err)
		fault := f.DropNextReply(claims)
		_, err = a.TryAcquire(ctx, id)
		require.True(t, fault.HasFired())
		require.ErrorIs(t, err, lease.ErrHeld, "the re-read found c holding it")
		var held *lease.HeldError
		require.ErrorAs(t, err, &held)
		require.Equal(t, "c", held.Owner)
		require.NoError(t, lc.Release(ctx))
	})

	t.Run("acquire of a named lease applied", func(t *testing.T) {
		locks := f.Collection("locks")
		na, err := lease.NewNamed(locks, &lease.Options{TTL: ttl, Owner: "a", Clock: a.Clock(), Mode: b.mode})
		require.NoError(t, err)
		nc, err := lease.NewNamed(b.db.Collection("locks"), &lease.Options{TTL: ttl, Owner: "c", Clock: b.clock, Mode: b.mode})
		require.NoError(t, err)
		droppedClaim(t, f, na, nc, b.db.Collection("locks"), "partner-api:user:42")
	})

	t.Run("renew applied", func(t *testing.T) {
		id := b.insert(t)
		la, err := a.TryAcquire(ctx, id)
		require.NoError(t, err)
		before := la.ExpiresAt()
		time.Sleep(5 * time.Millisecond)
		fault := f.DropNextReply(renewals)
		require.NoError(t, la.Renew(ctx), "the re-read found the renewal applied")
		require.True(t, fault.HasFired())
		require.True(t, la.ExpiresAt().After(before))
		require.True(t, load(t, b.coll, id).Lease.ExpiresAt.Equal(la.ExpiresAt()))
		require.NoError(t, la.Release(ctx))
	})

	t.Run("release applied", func(t *testing.T) {
		id := b.insert(t)
		la, err := a.TryAcquire(ctx, id)
		require.NoError(t, err)
		fault := f.DropNextReply(updates)
		require.NoError(t, la.Release(ctx), "the re-read found the release applied")
		require.True(t, fault.HasFired())
		require.ErrorIs(t, la.Err(), lease.ErrReleased)
		d := load(t, b.coll, id)
		require.Empty(t, owner(d.Lease))
		require.Equal(t, la.Epoch(), d.Lease.Epoch)
		requireFree(t, c, id, la.Epoch()+1)
	})

	t.Run("unresolved", func(t *testing.T) {
		// The reply is lost and the re-read fails too: the outcome is
		// reported as unknown, matching the network error.
		id := b.insert(t)
		la, err := a.TryAcquire(ctx, id)
		require.NoError(t, err)
		f.DropReplies(1, updates)
		f.DropReplies(100, mongotest.Commands([]string{"find"}, b.coll.Name()))
		err = la.Release(ctx)
		require.ErrorIs(t, err, lease.ErrUnknownOutcome)
		require.True(t, store.IsNetwork(err), "%v", err)
		require.NoError(t, la.Err(), "still held as far as anyone knows")
	})
}

// droppedClaim has a (whose traffic passes f) claim id while the reply of
// its findAndModify is dropped: a must learn from a re-read that it holds the
// lease, exactly once, and c must neither hold it too nor find it stuck after
// a releases.
func droppedClaim(t *testing.T, f *mongotest.Faulty, a, c *lease.Manager, coll *mongo.Collection, id any) {
	t.Helper()
	ctx := context.Background()
	fault := f.DropNextReply(mongotest.Commands([]string{"findAndModify"}, coll.Name()))
	la, err := a.TryAcquire(ctx, id)
	require.True(t, fault.HasFired())
	require.NoError(t, err, "the re-read found the claim applied")
	d := load(t, coll, id)
	require.Equal(t, a.Owner(), owner(d.Lease))
	require.Equal(t, la.Epoch(), d.Lease.Epoch)

	_, err = c.TryAcquire(ctx, id)
	require.ErrorIs(t, err, lease.ErrHeld, "no double holder")
	require.NoError(t, la.Release(ctx))
	requireFree(t, c, id, la.Epoch()+1)
}

// requireFree checks that m can take the lease on id at once, with epoch
// want: it is not stuck. It releases it again.
func requireFree(t *testing.T, m *lease.Manager, id any, want int64) {
	t.Helper()
	ctx := context.Background()
	l, err := m.TryAcquire(ctx, id)
	require.NoError(t, err, "no stuck lease")
	require.Equal(t, want, l.Epoch())
	require.NoError(t, l.Release(ctx))
}

// A release that finds the record no longer naming this holder, and cannot
// re-read it, reports the lease lost with reason Unread (not a takeover it
// never saw) and changes nothing.
func TestReleaseWithFailedRereadIsUnread(t *testing.T) {
	eachMode(t, testReleaseWithFailedRereadIsUnread)
}

//nolint:thelper // the body of a test, run once per mode
func testReleaseWithFailedRereadIsUnread(t *testing.T, mode lease.Mode) {
	ctx := context.Background()
	b := setup(t, mode)
	f := b.db.Faulty(t, nil)
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", time.Minute, nil)
	id := b.insert(t)
	la, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)

	// Someone else's claim lands behind a's back (as after an expiry).
	_, err = b.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{
		{Key: "$set", Value: bson.D{{Key: "_lease.owner", Value: "z"}}},
		{Key: "$inc", Value: bson.D{{Key: "_lease.epoch", Value: 1}}},
	})
	require.NoError(t, err)

	fault := f.DropReplies(50, mongotest.Commands([]string{"find"}, b.coll.Name()))
	err = la.Release(ctx)
	require.NotEmpty(t, fault.Dropped(), "the re-read's replies were dropped")
	require.ErrorIs(t, err, lease.ErrLost)
	require.NotErrorIs(t, err, lease.ErrReleased)
	var lost *lease.LostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, lease.Unread, lost.Reason)
	require.Empty(t, lost.Holder, "no holder is claimed without a read")
	require.True(t, store.IsNetwork(lost.Err), "Err is the re-read's failure: %v", lost.Err)
	require.Error(t, la.Context().Err(), "the lease's context ended")
	require.Equal(t, "z", owner(load(t, b.coll, id).Lease), "the release changed nothing")
}

// TestAcquireSettlesUnknownClaim: a claim is applied but its reply is lost
// and the re-read fails too (ErrUnknownOutcome). Acquire's next attempt
// finds its own claim in the record and holds the lease at once, instead of
// waiting out a lease it holds itself.
func TestAcquireSettlesUnknownClaim(t *testing.T) { eachMode(t, testAcquireSettlesUnknownClaim) }

//nolint:thelper // the body of a test, run once per mode
func testAcquireSettlesUnknownClaim(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	id := b.insert(t)
	f := b.db.Faulty(t, nil)
	var healed atomic.Bool
	unknowns := 0
	fault := unknownClaim(f, b, &healed)
	policy := fastRetry
	policy.OnRetry = func(at retry.Attempt) {
		// Only Acquire's attempt heals the re-reads: the policy also
		// retries the re-reads themselves, whose network errors come here.
		if errors.Is(at.Err, lease.ErrUnknownOutcome) {
			unknowns++
			healed.Store(true)
		}
	}
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", time.Hour, &lease.Options{
		ResolveTimeout: 300 * time.Millisecond,
		Retry:          policy,
	})
	actx, cancel := context.WithTimeout(ctx, 30*time.Second) // far below the TTL
	defer cancel()
	l, err := a.Acquire(actx, id)
	require.True(t, fault.HasFired())
	require.NoError(t, err, "Acquire settled its own claim")
	require.Equal(t, 1, unknowns, "the first attempt's outcome was unknown")
	d := load(t, b.coll, id)
	require.Equal(t, d.Lease.Epoch, l.Epoch(), "the claim applied is the lease's")
	require.Equal(t, "a", owner(d.Lease))
	require.NoError(t, l.Release(ctx))
}

// TestAcquireClaimsAgainAfterLateSettle: Acquire's claim is
// applied but its outcome is unknown (reply lost, re-read failed). Before the
// next attempt the local clock (Options.Now, moved by the test) passes that
// claim's deadline, while the server has not expired it (TTL one hour of
// real time). The next attempt finds its own claim, too old to use: Acquire
// releases it and claims again, and returns a live lease with a later epoch,
// instead of a *LostError.
func TestAcquireClaimsAgainAfterLateSettle(t *testing.T) {
	eachMode(t, testAcquireClaimsAgainAfterLateSettle)
}

//nolint:thelper // the body of a test, run once per mode
func testAcquireClaimsAgainAfterLateSettle(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	f := b.db.Faulty(t, nil)
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	const ttl = time.Hour
	var (
		healed   atomic.Bool
		unknowns atomic.Int32
		losts    atomic.Int32
	)
	policy := fastRetry
	// The policy also retries the re-reads that settle a claim (their
	// network errors come here too): only Acquire's own attempts, whose
	// errors are the lease's, heal the re-reads, so that the first attempt
	// surely ends with its outcome unknown.
	policy.OnRetry = func(at retry.Attempt) {
		t.Logf("retry after: %v", at.Err)
		switch {
		case errors.Is(at.Err, lease.ErrUnknownOutcome):
			unknowns.Add(1)
			skew.Add(int64(2 * ttl)) // the unknown claim's deadline passes
			healed.Store(true)
		case errors.Is(at.Err, lease.ErrLost):
			losts.Add(1)
			healed.Store(true)
		}
	}
	a, id, first := primed(t, b, f, &lease.Options{
		TTL:            ttl,
		ResolveTimeout: 300 * time.Millisecond,
		Retry:          policy,
		Now:            now,
		Clock:          b.clock, // the server's clock estimate stays on real time
	})

	fault := unknownClaim(f, b, &healed)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := a.Acquire(actx, id)
	require.True(t, fault.HasFired())
	require.NoError(t, err, "Acquire claimed again after its settled claim had expired locally")
	require.Equal(t, int32(1), unknowns.Load(), "the first attempt's outcome was unknown")
	require.Equal(t, int32(1), losts.Load(), "the second settled the claim too late, and released it")
	require.Equal(t, first+2, l.Epoch(), "the unknown claim, then the new one")
	require.NoError(t, l.Err())
	require.Positive(t, l.TimeLeft())
	d := load(t, b.coll, id)
	require.Equal(t, "a", owner(d.Lease))
	require.Equal(t, l.Epoch(), d.Lease.Epoch)
	require.NoError(t, l.Release(ctx))
}

// unknownClaim makes the outcome of the next claim (findAndModify) on b's
// collection unknown: its reply is dropped, and so is every re-read's until
// healed is set.
func unknownClaim(f *mongotest.Faulty, b *bundle, healed *atomic.Bool) *mongotest.Fault {
	fault := f.DropNextReply(mongotest.Commands([]string{"findAndModify"}, b.coll.Name()))
	reads := mongotest.Commands([]string{"find", "aggregate"}, b.coll.Name())
	f.DropReplies(1000, func(c *mongotest.Command) bool { return !healed.Load() && reads(c) })
	return fault
}

// TestSettlingReadsUseMajority: a claim is applied but its
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

// TestSettlingReadsWithoutMajority: a server that refuses
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

// TestDoInsertSettlesLostReply: DoInsert's insert is applied but its reply
// is lost, or it is held back and the client sees a network error before
// the server has it. Either way the read settles it: the function runs
// once, under the lease the document was inserted with, and the held copy
// delivered later changes nothing (the unique _id refuses it).
func TestDoInsertSettlesLostReply(t *testing.T) { eachMode(t, testDoInsertSettlesLostReply) }

//nolint:thelper // the body of a test, run once per mode
func testDoInsertSettlesLostReply(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	f := b.db.Faulty(t, nil)
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", time.Minute, nil)
	inserts := mongotest.Commands([]string{"insert"}, b.coll.Name())
	for _, held := range []bool{false, true} {
		id := bson.NewObjectID()
		var fault *mongotest.Fault
		if held {
			fault = f.HoldNext(inserts)
		} else {
			fault = f.DropNextReply(inserts)
		}
		runs := 0
		err := a.DoInsert(ctx, id, bson.D{{Key: "data", Value: "new"}}, func(_ context.Context, l *lease.Lease) error {
			runs++
			require.Equal(t, "a", owner(load(t, b.coll, id).Lease), "held while fn runs")
			return l.ReleaseWith(ctx, bson.D{{Key: "data", Value: "done"}})
		})
		require.True(t, fault.HasFired())
		require.NoError(t, err, "held %v: the read settled the insert", held)
		require.Equal(t, 1, runs)
		if held {
			_, err = fault.Deliver(ctx)
			require.NoError(t, err, "the copy reaches the server")
		}
		d := load(t, b.coll, id)
		require.Equal(t, "done", d.Data)
		require.Empty(t, owner(d.Lease), "released")
		n, err := b.coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: id}})
		require.NoError(t, err)
		require.Equal(t, int64(1), n)
	}
}

// TestStampRemembersMajorityRefusal: a server that refuses read concern
// majority (code 148, injected once) on the re-read of a stamp whose reply
// was lost has the stamp settled by a read without it, and the next Stamp on
// the same collection reads without majority at once.
func TestStampRemembersMajorityRefusal(t *testing.T) {
	eachMode(t, testStampRemembersMajorityRefusal)
}

//nolint:thelper // the body of a test, run once per mode
func testStampRemembersMajorityRefusal(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	f := b.db.Faulty(t, nil)
	docs := f.Collection(b.coll.Name())
	m := b.named(t, b.db.Collection("locks"), "a", time.Minute, nil)
	updates := mongotest.Commands([]string{"update"}, b.coll.Name())
	refused := f.ErrorBeforeApply(mongotest.Commands([]string{"find"}, b.coll.Name()), mongotest.ServerError{
		Code: 148, CodeName: "ReadConcernMajorityNotEnabled", Errmsg: "Majority read concern requested, but it is not supported by the storage engine.",
	})
	reads := recordReads(f, b.coll.Name())
	for i := range 2 {
		l, err := m.TryAcquire(ctx, "job")
		require.NoError(t, err)
		id := b.insert(t)
		fault := f.DropNextReply(updates)
		require.NoError(t, l.Stamp(ctx, docs, id), "stamp %d: the re-read found it", i)
		require.True(t, fault.HasFired())
		require.True(t, refused.HasFired())
		var stamp struct {
			Fence map[string]int64 `bson:"_fence"`
		}
		require.NoError(t, b.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&stamp))
		require.Equal(t, l.Epoch(), stamp.Fence["job"])
		require.NoError(t, l.Release(ctx))
	}
	got := reads()
	require.Len(t, got, 2, "after the refused read (not recorded), one read per stamp")
	for _, body := range got {
		_, err := body.LookupErr("readConcern", "level")
		require.Error(t, err, "no read concern after the refusal: %v", body)
	}
}

// TestReleaseWithLateReadAfterTakeover: ReleaseWith's update is lost before
// the server has it (a network error), and the re-read that settles it
// reaches the server only after the lease expired there and another owner
// claimed it. The release never applied, and ReleaseWith does not report it
// applied: it returns the *LostError with Reason Expired that the lease's
// deadline gave it (whether or not the write applied, as documented), and
// the fields it would have set are not there.
func TestReleaseWithLateReadAfterTakeover(t *testing.T) {
	eachMode(t, testReleaseWithLateReadAfterTakeover)
}

//nolint:thelper // the body of a test, run once per mode
func testReleaseWithLateReadAfterTakeover(t *testing.T, mode lease.Mode) {
	b := setup(t, mode)
	ctx := context.Background()
	f := b.db.Faulty(t, nil)
	// a 3 s lease: its claim, slow on a busy machine, still leaves it live.
	a := b.managerOn(t, f.Collection(b.coll.Name()), "a", 3*time.Second, &lease.Options{ResolveTimeout: 20 * time.Second, SafetyMargin: 500 * time.Millisecond})
	c := b.manager(t, "c", time.Minute, &lease.Options{Retry: fastRetry})
	id := b.insert(t)
	la, err := a.TryAcquire(ctx, id)
	require.NoError(t, err)

	claimed := make(chan struct{})
	isRead := mongotest.Commands([]string{"find", "aggregate"}, b.coll.Name())
	f.ErrorBeforeApply(func(cmd *mongotest.Command) bool {
		if isRead(cmd) {
			<-claimed // a's re-read reaches the server after c's claim
		}
		return false
	}, mongotest.ServerError{Code: 1, Errmsg: "never sent"})
	held := f.HoldNext(mongotest.Commands([]string{"update"}, b.coll.Name()))
	done := make(chan error, 1)
	go func() { done <- la.ReleaseWith(ctx, bson.D{{Key: "data", Value: "released"}}) }()
	select {
	case <-held.Fired():
	case err := <-done:
		t.Fatalf("ReleaseWith returned before its update was sent: %v", err)
	}
	lc, err := c.Acquire(ctx, id) // once a's lease expired on the server
	require.NoError(t, err)
	close(claimed)
	err = <-done
	var lost *lease.LostError
	require.ErrorAs(t, err, &lost, "not nil: the release never applied")
	require.Equal(t, lease.Expired, lost.Reason)
	d := load(t, b.coll, id)
	require.Equal(t, "initial", d.Data, "the fields were not set")
	require.Equal(t, "c", owner(d.Lease))
	require.NoError(t, lc.Release(ctx))
}

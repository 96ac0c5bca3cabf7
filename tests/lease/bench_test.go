package lease_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/store"
)

// The benchmarks time a lease's claim and release beside the raw driver call
// doing the same write (same filter, same update, same options) in the same
// run, so the ratio shows what the package adds: the clock estimate, argument
// checks, decoding, the Lease with its deadline timer.
//
//	go test -run='^$' -bench=. -benchmem -benchtime=200x ./tests/lease
//
// The lease calls run on a Manager without an Observer, whose allocations
// must be what they were before the observe package, and with the slog
// Observer at Info level ("+slog"), as a service runs it, which may add at
// most one allocation per call.
// On the embedded backend the server runs inside the test binary, so its
// allocations are counted too and vary by a few per operation from run to
// run; against MONGODB_URI (DocumentDB, MongoDB) they are the client's
// alone and repeat exactly. TestObserveAllocations, in the library's own
// tests, pins the observe package's part exactly.

// observers are the Observers each lease benchmark runs with.
var observers = []struct {
	name string
	obs  observe.Observer
}{
	{"", nil},
	// A handler at Info, so that its level check is what runs, as in a service.
	{"+slog", observe.Slog(slog.New(slog.NewTextHandler(io.Discard, nil)))}, //nolint:sloglint // see above
}

// benchSetup returns a collection holding one document, the one every
// iteration works on. (FerretDB v1 scans the whole collection for any filter
// but a bare _id, so more documents would time the scan.)
func benchSetup(b *testing.B, name string) (*mongo.Collection, bson.ObjectID) {
	b.Helper()
	db := mongotest.New(b)
	coll := db.Collection(name)
	id := bson.NewObjectID()
	if _, err := coll.InsertOne(context.Background(), bson.D{{Key: "_id", Value: id}, {Key: "data", Value: "x"}}); err != nil {
		b.Fatal(err)
	}
	return coll, id
}

func benchManager(b *testing.B, coll *mongo.Collection, obs observe.Observer) *lease.Manager {
	b.Helper()
	m, err := lease.New(coll, &lease.Options{TTL: time.Minute, Owner: "bench", Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := m.Clock().Now(context.Background()); err != nil { // first sync outside the timing
		b.Fatal(err)
	}
	return m
}

// rawClaim is the claim's findOneAndUpdate, as the package sends it.
func rawClaim(ctx context.Context, coll *mongo.Collection, clock *store.ServerClock, id bson.ObjectID) (bson.Raw, error) {
	est, err := clock.Now(ctx)
	if err != nil {
		return nil, err
	}
	filter := bson.D{
		{Key: "_id", Value: id},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: "_lease.owner", Value: nil}},
			bson.D{{Key: "_lease.expiresAt", Value: bson.D{{Key: "$lt", Value: est.Earliest()}}}},
		}},
	}
	update := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: "_lease.owner", Value: "bench"},
			{Key: "_lease.expiresAt", Value: est.Time.Add(time.Minute)},
			{Key: "_lease.acquiredAt", Value: est.Time},
			{Key: "_lease.claim", Value: bson.NewObjectID()},
		}},
		{Key: "$inc", Value: bson.D{{Key: "_lease.epoch", Value: int64(1)}}},
	}
	return coll.FindOneAndUpdate(ctx, filter, update, options.FindOneAndUpdate().SetReturnDocument(options.After)).Raw()
}

// rawRelease is the release's updateOne, as the package sends it.
func rawRelease(ctx context.Context, coll *mongo.Collection, id bson.ObjectID, epoch int64) error {
	filter := bson.D{{Key: "_id", Value: id}, {Key: "_lease.owner", Value: "bench"}, {Key: "_lease.epoch", Value: epoch}}
	update := bson.D{{Key: "$unset", Value: bson.D{
		{Key: "_lease.owner", Value: ""},
		{Key: "_lease.claim", Value: ""},
		{Key: "_lease.expiresAt", Value: ""},
	}}}
	res, err := coll.UpdateOne(ctx, filter, update)
	if err == nil && res.MatchedCount != 1 {
		err = fmt.Errorf("release matched %d", res.MatchedCount)
	}
	return err
}

func rawClock(b *testing.B, coll *mongo.Collection) *store.ServerClock {
	b.Helper()
	clock := store.NewServerClock(store.HelloSampler(coll.Database().Client()), nil)
	if _, err := clock.Now(context.Background()); err != nil {
		b.Fatal(err)
	}
	return clock
}

// BenchmarkAcquire times claims of a free lease; each is released outside
// the timing.
func BenchmarkAcquire(b *testing.B) {
	ctx := context.Background()
	b.Run("raw-findOneAndUpdate", func(b *testing.B) {
		coll, id := benchSetup(b, "raw")
		clock := rawClock(b, coll)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			raw, err := rawClaim(ctx, coll, clock, id)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := rawRelease(ctx, coll, id, raw.Lookup("_lease", "epoch").Int64()); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	for _, o := range observers {
		b.Run("lease-TryAcquire"+o.name, func(b *testing.B) {
			coll, id := benchSetup(b, "lease")
			m := benchManager(b, coll, o.obs)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				l, err := m.TryAcquire(ctx, id)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkRelease times releases of a held lease; each is claimed outside
// the timing.
func BenchmarkRelease(b *testing.B) {
	ctx := context.Background()
	b.Run("raw-updateOne", func(b *testing.B) {
		coll, id := benchSetup(b, "raw")
		clock := rawClock(b, coll)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			b.StopTimer()
			raw, err := rawClaim(ctx, coll, clock, id)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if err := rawRelease(ctx, coll, id, raw.Lookup("_lease", "epoch").Int64()); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, o := range observers {
		b.Run("lease-Release"+o.name, func(b *testing.B) {
			coll, id := benchSetup(b, "lease")
			m := benchManager(b, coll, o.obs)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				l, err := m.TryAcquire(ctx, id)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package versioned_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// Each benchmark runs an operation of the repository beside the raw driver
// calls that do the same work, in the same run and on the same server:
//
//	go test -run='^$' -bench=. -benchmem -benchtime=200x ./tests/versioned
//
// Each operation runs on a repository without an Observer ("versioned"),
// whose allocations must be what they were before the observe package, and
// with the slog Observer at Info level ("versioned+slog"), as a service
// runs it, which may add at most one allocation per operation.
// On the embedded backend the server runs inside the test binary, so its
// allocations are counted too and vary by a few per operation from run to
// run; against MONGODB_URI (DocumentDB, MongoDB) they are the client's
// alone and repeat exactly. TestObserveAllocations, in the library's own
// tests, pins the observe package's part exactly.

// repos are the repositories each benchmark runs the operation on.
var repos = []struct {
	name string
	opts *versioned.Options
}{
	{"versioned", nil},
	// A handler at Info, so that its level check is what runs, as in a service.
	{"versioned+slog", &versioned.Options{Observer: observe.Slog(slog.New(slog.NewTextHandler(io.Discard, nil)))}}, //nolint:sloglint // see above
}

func benchSetup(b *testing.B, opts *versioned.Options) (*versioned.Repo[account], *mongo.Collection, context.Context) {
	b.Helper()
	db := mongotest.New(b)
	coll := db.Collection("docs")
	repo, err := versioned.New[account](coll, opts)
	if err != nil {
		b.Fatal(err)
	}
	return repo, coll, context.Background()
}

// benchWithDoc is benchSetup with the document "a" stored.
func benchWithDoc(b *testing.B, opts *versioned.Options) (*versioned.Repo[account], *mongo.Collection, context.Context) {
	b.Helper()
	repo, coll, ctx := benchSetup(b, opts)
	must(b, repo.Insert(ctx, benchAccount("a")))
	return repo, coll, ctx
}

func benchAccount(id string) *account {
	return &account{ID: id, Owner: "ana", Balance: 100, Tags: []string{"a", "b"}}
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// rawCAS is the driver's version-checked update of a: the given operators
// and $inc of the version, filtered on the id and a's version.
func rawCAS(ctx context.Context, b *testing.B, coll *mongo.Collection, a *account, update bson.D) {
	b.Helper()
	update = append(update, bson.E{Key: "$inc", Value: bson.D{{Key: "version", Value: 1}}})
	res, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: a.ID}, {Key: "version", Value: a.Version}}, update)
	must(b, err)
	if res.MatchedCount != 1 {
		b.Fatal("conflict")
	}
}

// rawUpdate is Update's work done with the driver: a's balance raised, and
// every mapped field written under a version check.
func rawUpdate(ctx context.Context, b *testing.B, coll *mongo.Collection, a *account) {
	b.Helper()
	a.Balance++
	rawCAS(ctx, b, coll, a, bson.D{
		{Key: "$set", Value: bson.D{{Key: "owner", Value: a.Owner}, {Key: "balance", Value: a.Balance}, {Key: "tags", Value: a.Tags}}},
		{Key: "$unset", Value: bson.D{{Key: "note", Value: ""}, {Key: "attrs", Value: ""}}},
	})
	a.Version++
}

func BenchmarkInsert(b *testing.B) {
	for _, r := range repos {
		b.Run(r.name, func(b *testing.B) {
			repo, _, ctx := benchSetup(b, r.opts)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				must(b, repo.Insert(ctx, benchAccount(strconv.Itoa(i))))
			}
		})
	}
	b.Run("raw_driver", func(b *testing.B) {
		_, coll, ctx := benchSetup(b, nil)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			a := benchAccount(strconv.Itoa(i))
			a.Version = 1
			_, err := coll.InsertOne(ctx, a)
			must(b, err)
		}
	})
}

func BenchmarkGet(b *testing.B) {
	for _, r := range repos {
		b.Run(r.name, func(b *testing.B) {
			repo, _, ctx := benchWithDoc(b, r.opts)
			b.ReportAllocs()
			for b.Loop() {
				_, err := repo.Get(ctx, "a")
				must(b, err)
			}
		})
	}
	b.Run("raw_driver", func(b *testing.B) {
		_, coll, ctx := benchWithDoc(b, nil)
		b.ReportAllocs()
		for b.Loop() {
			var a account
			must(b, coll.FindOne(ctx, bson.D{{Key: "_id", Value: "a"}}).Decode(&a))
		}
	})
}

// BenchmarkUpdate writes back a held copy under a version check.
func BenchmarkUpdate(b *testing.B) {
	for _, r := range repos {
		b.Run(r.name, func(b *testing.B) {
			repo, _, ctx := benchSetup(b, r.opts)
			a := benchAccount("a")
			must(b, repo.Insert(ctx, a))
			b.ReportAllocs()
			for b.Loop() {
				a.Balance++
				must(b, repo.Update(ctx, a))
			}
		})
	}
	b.Run("raw_driver", func(b *testing.B) {
		repo, coll, ctx := benchSetup(b, nil)
		a := benchAccount("a")
		must(b, repo.Insert(ctx, a))
		b.ReportAllocs()
		for b.Loop() {
			rawUpdate(ctx, b, coll, a)
		}
	})
}

// BenchmarkModify is an uncontended read-modify-write: a find and a
// version-checked update.
func BenchmarkModify(b *testing.B) {
	for _, r := range repos {
		b.Run(r.name, func(b *testing.B) {
			repo, _, ctx := benchWithDoc(b, r.opts)
			b.ReportAllocs()
			for b.Loop() {
				_, err := repo.Modify(ctx, "a", func(a *account) error { a.Balance++; return nil })
				must(b, err)
			}
		})
	}
	b.Run("raw_driver", func(b *testing.B) {
		_, coll, ctx := benchWithDoc(b, nil)
		b.ReportAllocs()
		for b.Loop() {
			var a account
			must(b, coll.FindOne(ctx, bson.D{{Key: "_id", Value: "a"}}).Decode(&a))
			a.Balance++
			rawCAS(ctx, b, coll, &a, bson.D{{Key: "$set", Value: bson.D{{Key: "balance", Value: a.Balance}}}})
		}
	})
	// docstore's strategy (gocloud.dev/docstore/mongodocstore): read, then
	// replace the whole document filtered on its revision.
	b.Run("docstore", func(b *testing.B) {
		_, coll, ctx := benchWithDoc(b, nil)
		b.ReportAllocs()
		for b.Loop() {
			docstoreIncrement(ctx, b, coll, "a")
		}
	})
}

// BenchmarkModifyRetried is a read-modify-write whose first write loses to
// another writer: fn's first call moves the document's version behind its
// back, so the version-checked write conflicts and Modify retries once. Rand
// 0 makes the retry's delay 0, so the time is the two rounds' work.
func BenchmarkModifyRetried(b *testing.B) {
	p := retry.Policy{Rand: func() float64 { return 0 }}
	for _, r := range repos {
		b.Run(r.name, func(b *testing.B) {
			repo, coll, ctx := benchWithDoc(b, r.opts)
			bump := bson.D{{Key: "$inc", Value: bson.D{{Key: "version", Value: 1}}}}
			b.ReportAllocs()
			for b.Loop() {
				calls := 0
				_, err := repo.Modify(ctx, "a", func(a *account) error {
					calls++
					if calls == 1 {
						_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "a"}}, bump)
						must(b, err)
					}
					a.Balance++
					return nil
				}, versioned.WithRetry(p))
				must(b, err)
				if calls != 2 {
					b.Fatalf("fn ran %d times, want 2 (one conflict, one retry)", calls)
				}
			}
		})
	}
}

// docstoreIncrement is docstore's read-modify-write of document id: read
// it, then replace it filtered on the revision it had.
func docstoreIncrement(ctx context.Context, b *testing.B, coll *mongo.Collection, id string) {
	b.Helper()
	var a account
	must(b, coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&a))
	a.Balance++
	rev := a.Version
	a.Version++
	res, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "version", Value: rev}}, &a)
	must(b, err)
	if res.MatchedCount != 1 {
		b.Fatal("conflict")
	}
}

// BenchmarkGuarded is a conditional decrement that returns the document
// after it; raw_updateOne does the decrement without returning it.
func BenchmarkGuarded(b *testing.B) {
	cond := bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: 1}}}}
	dec := bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -1}}}}
	start := func(b *testing.B, opts *versioned.Options) (*versioned.Repo[account], *mongo.Collection, context.Context) {
		b.Helper()
		repo, coll, ctx := benchSetup(b, opts)
		a := benchAccount("a")
		a.Balance = 1 << 40
		must(b, repo.Insert(ctx, a))
		return repo, coll, ctx
	}
	for _, r := range repos {
		b.Run(r.name, func(b *testing.B) {
			repo, _, ctx := start(b, r.opts)
			b.ReportAllocs()
			for b.Loop() {
				_, err := repo.Guarded(ctx, "a", cond, dec)
				must(b, err)
			}
		})
	}
	b.Run("raw_driver", func(b *testing.B) {
		_, coll, ctx := start(b, nil)
		filter := append(bson.D{{Key: "_id", Value: "a"}}, cond...)
		update := bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -1}, {Key: "version", Value: 1}}}}
		opts := options.FindOneAndUpdate().SetReturnDocument(options.After)
		b.ReportAllocs()
		for b.Loop() {
			var a account
			must(b, coll.FindOneAndUpdate(ctx, filter, update, opts).Decode(&a))
		}
	})
	b.Run("raw_updateOne", func(b *testing.B) {
		_, coll, ctx := start(b, nil)
		filter := append(bson.D{{Key: "_id", Value: "a"}}, cond...)
		update := bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -1}, {Key: "version", Value: 1}}}}
		b.ReportAllocs()
		for b.Loop() {
			res, err := coll.UpdateOne(ctx, filter, update)
			must(b, err)
			if res.MatchedCount != 1 {
				must(b, errors.New("guard failed"))
			}
		}
	})
}

// BenchmarkAlternating runs each operation of the repository and the raw
// driver calls that do the same work in turn, one of each per iteration (in
// either order, by turns), and reports each one's mean time and the
// repository's as a multiple of the driver's ("x-raw"): both meet the same
// load as this machine's speed drifts, which separate benchmarks run one
// after the other do not.
//
//	go test -run='^$' -bench=Alternating -benchtime=1000x ./tests/versioned
func BenchmarkAlternating(b *testing.B) {
	cond := bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: 1}}}}
	dec := bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -1}}}}
	b.Run("Update", func(b *testing.B) {
		repo, coll, ctx := benchSetup(b, nil)
		a, r := benchAccount("a"), benchAccount("r")
		must(b, repo.Insert(ctx, a))
		must(b, repo.Insert(ctx, r))
		alternate(b, func() {
			a.Balance++
			must(b, repo.Update(ctx, a))
		}, func() { rawUpdate(ctx, b, coll, r) })
	})
	b.Run("Guarded", func(b *testing.B) {
		repo, coll, ctx := benchSetup(b, nil)
		for _, id := range []string{"a", "r"} {
			a := benchAccount(id)
			a.Balance = 1 << 40
			must(b, repo.Insert(ctx, a))
		}
		filter := append(bson.D{{Key: "_id", Value: "r"}}, cond...)
		update := bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -1}, {Key: "version", Value: 1}}}}
		opts := options.FindOneAndUpdate().SetReturnDocument(options.After)
		alternate(b, func() {
			_, err := repo.Guarded(ctx, "a", cond, dec)
			must(b, err)
		}, func() {
			var a account
			must(b, coll.FindOneAndUpdate(ctx, filter, update, opts).Decode(&a))
		})
	})
	b.Run("Modify-docstore", func(b *testing.B) {
		repo, coll, ctx := benchSetup(b, nil)
		must(b, repo.Insert(ctx, benchAccount("a")))
		must(b, repo.Insert(ctx, benchAccount("r")))
		alternate(b, func() {
			_, err := repo.Modify(ctx, "a", func(a *account) error { a.Balance++; return nil })
			must(b, err)
		}, func() { docstoreIncrement(ctx, b, coll, "r") })
	})
}

// alternate runs lib and raw once each per iteration, in turns of order,
// and reports the median time of each and lib's over raw's.
func alternate(b *testing.B, lib, raw func()) {
	b.Helper()
	var tl, tr []time.Duration
	for b.Loop() {
		first, second, t1, t2 := lib, raw, &tl, &tr
		if len(tl)%2 == 1 {
			first, second, t1, t2 = raw, lib, &tr, &tl
		}
		t0 := time.Now()
		first()
		mid := time.Now()
		second()
		*t2 = append(*t2, time.Since(mid))
		*t1 = append(*t1, mid.Sub(t0))
	}
	ml, mr := median(tl), median(tr)
	b.ReportMetric(float64(ml.Nanoseconds()), "lib-ns/op")
	b.ReportMetric(float64(mr.Nanoseconds()), "raw-ns/op")
	b.ReportMetric(float64(ml)/float64(mr), "x-raw")
	b.ReportMetric(0, "ns/op")
}

func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

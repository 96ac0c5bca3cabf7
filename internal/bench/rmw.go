package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// counter is the document every strategy increments.
type counter struct {
	ID      string `bson:"_id"`
	N       int64  `bson:"n"`
	Version int64  `bson:"version"`
}

// client is a connection of its own to the server (a "process"), counting
// the commands it sends.
type client struct {
	st   *store.Store
	coll *mongo.Collection
	sent atomic.Int64
}

// notCounted are the commands that are not round trips of the operations
// measured: monitoring, handshakes, and versioned's one-off buildInfo.
var notCounted = map[string]bool{"hello": true, "isMaster": true, "ping": true, "endSessions": true, "buildInfo": true}

func connect(ctx context.Context, uri, db string) (*client, error) {
	c := &client{}
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if !notCounted[e.CommandName] {
			c.sent.Add(1)
		}
	}}
	st, err := store.Connect(ctx, uri, &store.Options{AppName: "mongocas-bench", ClientOptions: options.Client().SetMonitor(mon)})
	if err != nil {
		return nil, err
	}
	c.st = st
	c.coll = st.Database(db).Collection("counters")
	return c, nil
}

// inc is one increment by a writer of process proc: nil once it is done,
// an error if it gave up.
type inc func(ctx context.Context, proc int) error

// strategy makes, for one cell, the increment of document id through the
// given collection handles (one per process, each through its own client).
type strategy struct {
	name string
	make func(ctx context.Context, colls []*mongo.Collection, id string) (inc, error)
}

// modifyPolicy is the backoff docstore's strategy gets: Modify's defaults.
var modifyPolicy = retry.Policy{MaxAttempts: -1, MaxElapsedTime: versioned.DefaultRetryTime}

var allStrategies = []strategy{
	{"Modify", func(ctx context.Context, colls []*mongo.Collection, id string) (inc, error) {
		repos, err := reposOf(ctx, colls, id)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, p int) error {
			_, err := repos[p].Modify(ctx, id, func(c *counter) error { c.N++; return nil })
			return err
		}, nil
	}},
	{"Guarded", func(ctx context.Context, colls []*mongo.Collection, id string) (inc, error) {
		repos, err := reposOf(ctx, colls, id)
		if err != nil {
			return nil, err
		}
		upd := bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: int64(1)}}}}
		return func(ctx context.Context, p int) error {
			_, err := repos[p].Guarded(ctx, id, nil, upd)
			return err
		}, nil
	}},
	{"raw CAS loop", func(ctx context.Context, colls []*mongo.Collection, id string) (inc, error) {
		if _, err := colls[0].InsertOne(ctx, counter{ID: id, Version: 1}); err != nil {
			return nil, err
		}
		return func(ctx context.Context, p int) error {
			coll := colls[p]
			for ctx.Err() == nil {
				var c counter
				if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&c); err != nil {
					return err
				}
				res, err := coll.UpdateOne(ctx,
					bson.D{{Key: "_id", Value: id}, {Key: "version", Value: c.Version}},
					bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: c.N + 1}}}, {Key: "$inc", Value: bson.D{{Key: "version", Value: int64(1)}}}})
				if err != nil {
					return err
				}
				if res.MatchedCount == 1 {
					return nil
				}
			}
			return ctx.Err()
		}, nil
	}},
	{"docstore-style", func(ctx context.Context, colls []*mongo.Collection, id string) (inc, error) {
		// gocloud.dev/docstore/mongodocstore is built on mongo-driver v1
		// (v0.46.0 and its main branch in August 2026 require v1.17.9; no
		// version uses v2), so its strategy is written here with
		// the raw v2 driver: a revision field holding a fresh unique string
		// per write, read-modify-write, an update filtered on the id and
		// the revision read, and on a failed precondition (matched 0) a
		// retry after the same backoff as Modify.
		type doc struct {
			ID  string `bson:"_id"`
			N   int64  `bson:"n"`
			Rev string `bson:"DocstoreRevision"`
		}
		if _, err := colls[0].InsertOne(ctx, doc{ID: id, Rev: rand.Text()}); err != nil {
			return nil, err
		}
		return func(ctx context.Context, p int) error {
			coll := colls[p]
			return retry.Do(ctx, modifyPolicy, func(ctx context.Context) error {
				var d doc
				if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d); err != nil {
					return retry.Permanent(err)
				}
				res, err := coll.UpdateOne(ctx,
					bson.D{{Key: "_id", Value: id}, {Key: "DocstoreRevision", Value: d.Rev}},
					bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: d.N + 1}, {Key: "DocstoreRevision", Value: rand.Text()}}}})
				if err != nil {
					return retry.Permanent(err)
				}
				if res.MatchedCount == 0 {
					return errPrecondition
				}
				return nil
			})
		}, nil
	}},
}

// reposOf returns a Repo per process and inserts the counter id.
func reposOf(ctx context.Context, colls []*mongo.Collection, id string) ([]*versioned.Repo[counter], error) {
	repos := make([]*versioned.Repo[counter], len(colls))
	for i, c := range colls {
		var err error
		if repos[i], err = versioned.New[counter](c, nil); err != nil {
			return nil, err
		}
	}
	return repos, repos[0].Insert(ctx, &counter{ID: id})
}

// errPrecondition is docstore's FailedPrecondition: the revision moved.
var errPrecondition = retryable{errors.New("revision changed")}

type retryable struct{ error }

func (retryable) Retryable() bool { return true }

// cellResult is one strategy at one N in one topology.
type cellResult struct {
	ok, gaveUp int64
	elapsed    time.Duration
	sent       int64
	p99        time.Duration
	max        time.Duration // the longest call: a starved caller shows here, not in p99
	final      int64         // the counter at the end
}

func (r cellResult) goodput() float64 { return float64(r.ok) / r.elapsed.Seconds() }
func (r cellResult) rtt() float64     { return float64(r.sent) / float64(max(r.ok, 1)) }

// rmwResults holds every cell: [topology][strategy][n].
type rmwResults map[string]map[string]map[int]cellResult

// Topologies.
const (
	oneProc   = "1 process"
	fourProcs = "4 processes"
)

func runRMW(ctx context.Context, srv *server, strategies []strategy, counts []int, cell time.Duration, runs int) (rmwResults, error) {
	db := "mongocas_bench_" + rand.Text()[:8]
	clients := make([]*client, 5) // [0]: the one process; [1..4]: the four
	for i := range clients {
		c, err := connect(ctx, srv.uri, db)
		if err != nil {
			return nil, err
		}
		defer func() { _ = c.st.Close(context.Background()) }()
		clients[i] = c
	}
	defer func() { _ = clients[0].coll.Database().Drop(context.Background()) }()
	// Warm up the server, the clients and the connections first: the first
	// cells of a run would otherwise be the slowest.
	for _, s := range strategies {
		for _, cs := range [][]*client{clients[:1], clients[1:]} {
			if _, err := runCell(ctx, s, cs, len(cs), cell/2); err != nil {
				return nil, fmt.Errorf("warm-up, %s: %w", s.name, err)
			}
		}
	}
	// The runs of a cell alternate with those of the other strategies at
	// the same N and topology (run 1 of each, then run 2 of each, ...): this
	// machine's speed drifts over seconds, and strategies compared side by
	// side should meet the same drift.
	res := rmwResults{}
	for _, topo := range []string{oneProc, fourProcs} {
		res[topo] = map[string]map[int]cellResult{}
		for _, s := range strategies {
			res[topo][s.name] = map[int]cellResult{}
		}
		for _, n := range counts {
			cs := clients[:1]
			if topo == fourProcs {
				cs = clients[1 : 1+min(4, n)]
			}
			rs := make([][]cellResult, len(strategies))
			for range runs {
				for i, s := range strategies {
					r, err := runCell(ctx, s, cs, n, cell)
					if err != nil {
						return nil, fmt.Errorf("%s, %s, N=%d: %w", topo, s.name, n, err)
					}
					rs[i] = append(rs[i], r)
				}
			}
			for i, s := range strategies {
				slices.SortFunc(rs[i], func(a, b cellResult) int { return cmp.Compare(a.goodput(), b.goodput()) })
				r := rs[i][len(rs[i])/2] // the median run, by goodput
				res[topo][s.name][n] = r
				var all int64
				for _, x := range rs[i] {
					all += x.gaveUp
				}
				fmt.Fprintf(stderr, "%-11s %-15s N=%-2d %6.0f/s %5.2f rt/success p99 %-8v max %-8v gave up %d (in all %d runs: %d)\n", topo, s.name, n, r.goodput(), r.rtt(), r.p99.Round(time.Millisecond), r.max.Round(time.Millisecond), r.gaveUp, len(rs[i]), all)
			}
		}
	}
	return res, nil
}

// runCell runs n writers spread over the clients cs for about d, and
// checks the counter. Each run has a collection of its own: FerretDB v1
// scans a collection for any filter but a bare _id, so documents of earlier
// runs would slow the later ones.
func runCell(ctx context.Context, s strategy, cs []*client, n int, d time.Duration) (cellResult, error) {
	id := "c-" + rand.Text()[:10]
	colls := make([]*mongo.Collection, len(cs))
	for i, c := range cs {
		colls[i] = c.coll.Database().Collection(id)
	}
	do, err := s.make(ctx, colls, id)
	if err != nil {
		return cellResult{}, err
	}
	for _, c := range cs {
		c.sent.Store(0)
	}
	var (
		ok, gaveUp atomic.Int64
		mu         sync.Mutex
		lat        []time.Duration
		wg         sync.WaitGroup
		firstErr   error
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range n {
		p := w % len(cs)
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				err := do(ctx, p)
				mine = append(mine, time.Since(t0))
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, retry.ErrExhausted), errors.Is(err, retry.ErrBudgetExhausted),
					errors.Is(err, versioned.ErrConflict):
					// Out of retries, or (Guarded) its anchor pushed out of
					// the write-id window more often than it re-reads.
					gaveUp.Add(1)
				default:
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return cellResult{}, firstErr
	}
	r := cellResult{ok: ok.Load(), gaveUp: gaveUp.Load(), elapsed: elapsed, p99: percentile(lat, 0.99), max: percentile(lat, 1)}
	for _, c := range cs {
		r.sent += c.sent.Load()
	}
	var c counter
	if err := colls[0].FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&c); err != nil {
		return r, err
	}
	r.final = c.N
	if r.final != r.ok {
		return r, fmt.Errorf("counter is %d after %d acknowledged increments", r.final, r.ok)
	}
	return r, nil
}

// percentile returns the p-quantile of ds (nearest rank).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// printRMW prints one table per topology, each followed by Modify's goodput
// as a ratio of docstore's at each N.
func printRMW(res rmwResults, strategies []strategy, counts []int) {
	for _, topo := range []string{oneProc, fourProcs} {
		fmt.Printf("Read-modify-write of one document, %s (4 processes: min(4, N) clients of N/4 writers)\n\n", topo)
		fmt.Println("| strategy | N | goodput /s | vs 1 writer | round trips per success | p99 latency | longest call | gave up |")
		fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, s := range strategies {
			cells := res[topo][s.name]
			base := res[oneProc][s.name][counts[0]].goodput()
			for _, n := range counts {
				r := cells[n]
				fmt.Printf("| %s | %d | %.0f | %.2fx | %.2f | %v | %v | %d |\n", s.name, n, r.goodput(), r.goodput()/base, r.rtt(), r.p99.Round(100*time.Microsecond), r.max.Round(100*time.Microsecond), r.gaveUp)
			}
		}
		fmt.Println()
		mod, ds := res[topo]["Modify"], res[topo]["docstore-style"]
		if mod != nil && ds != nil {
			fmt.Printf("Modify's goodput / docstore's, %s:", topo)
			for _, n := range counts {
				fmt.Printf(" N=%d %.2fx", n, mod[n].goodput()/ds[n].goodput())
			}
			fmt.Print(" (each from runs alternating with the other's)\n\n")
		}
	}
}

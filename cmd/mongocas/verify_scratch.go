package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/store"
)

// scratchPrefix starts the name of every collection verify writes to:
// scratchPrefix, 8 hex digits naming the run, "_", the workload.
const scratchPrefix = "mongocas_verify_"

// beatEvery is how often a run marks its scratch collections as in use;
// a run whose mark is older than beatStale is taken for an interrupted one.
const (
	beatEvery = 2 * time.Second
	beatStale = time.Minute
)

// runOf returns the run's prefix of a scratch collection's name.
func runOf(coll string) string {
	rest := strings.TrimPrefix(coll, scratchPrefix)
	if i := strings.IndexByte(rest, '_'); i >= 0 {
		rest = rest[:i]
	}
	return scratchPrefix + rest
}

// checkScratch looks at the database before a run: the scratch collections
// of earlier runs (dropped with --drop-leftovers, else named with how to drop
// them), and other collections (a database that holds data needs --yes).
func (c *cli) checkScratch(ctx context.Context, db *mongo.Database, yes, dropLeftovers bool) error {
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return fail(fmt.Errorf("list the collections of %s: %w", db.Name(), err), "the user needs read access to the database")
	}
	runs := map[string][]string{}
	var others []string
	for _, n := range names {
		switch {
		case strings.HasPrefix(n, scratchPrefix):
			runs[runOf(n)] = append(runs[runOf(n)], n)
		case strings.HasPrefix(n, store.ProbeCollection), strings.HasPrefix(n, "system."):
		default:
			others = append(others, n)
		}
	}
	var left []string
	for run := range runs {
		var mark struct {
			Beat time.Time `bson:"beat"`
		}
		err := db.Collection(run+"_run").FindOne(ctx, bson.D{{Key: "_id", Value: "run"}}).Decode(&mark)
		if err == nil && time.Since(mark.Beat) < beatStale {
			fmt.Fprintf(c.errw, "mongocas verify: another verify run is going on here (%s_*, alive %v ago); its collections are left alone\n",
				run, short(time.Since(mark.Beat)))
			continue
		}
		left = append(left, run)
	}
	slices.Sort(left)
	if len(left) > 0 {
		if dropLeftovers {
			for _, run := range left {
				dropped, err := dropRun(ctx, db, run)
				if err != nil {
					return fail(fmt.Errorf("drop the leftovers %s_*: %w", run, err), "drop them by hand: db.getCollectionNames() lists them")
				}
				fmt.Fprintf(c.errw, "mongocas verify: dropped %d scratch collections an interrupted run left (%s_*)\n", dropped, run)
			}
		} else {
			fmt.Fprintf(c.errw, "mongocas verify: %d interrupted runs left scratch collections here (%s_*): "+
				"drop them with mongocas verify --drop-leftovers (they hold nothing of yours)\n", len(left), strings.Join(left, "_*, "))
		}
	}
	if len(others) > 0 && !yes {
		slices.Sort(others)
		shown := others
		if len(shown) > 5 {
			shown = append(slices.Clone(shown[:5]), "...")
		}
		return &cliError{err: fmt.Errorf("database %s holds %d other collections (%s): verify adds scratch collections "+
			"beside them for the run (and drops them), and loads the server meanwhile", db.Name(), len(others), strings.Join(shown, ", ")),
			fix:  "run it on a database of its own (--db mongocas_verify), or pass --yes to run here all the same; nothing was changed",
			code: exitError}
	}
	return nil
}

// dropRun drops the scratch collections of one run and returns how many.
func dropRun(ctx context.Context, db *mongo.Database, run string) (int, error) {
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, name := range names {
		if runOf(name) != run || !strings.HasPrefix(name, scratchPrefix) {
			continue
		}
		if err := db.Collection(name).Drop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// dropScratch drops this run's scratch collections, after the run, a
// failure or an interruption, and says so.
func (c *cli) dropScratch(db *mongo.Database, run string, interrupted bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := dropRun(ctx, db, run)
	why := "run over"
	if interrupted {
		why = "interrupted"
	}
	if err != nil {
		fmt.Fprintf(c.errw, "mongocas verify: %s; could not drop every scratch collection %s_*: %v; "+
			"drop them with mongocas verify --drop-leftovers\n", why, run, err)
		return
	}
	fmt.Fprintf(c.errw, "mongocas verify: %s; dropped its %d scratch collections (%s_*)\n", why, n, run)
}

// heartbeat marks the run's scratch collections as in use, every beatEvery
// until the returned stop is called, so that another run does not take them
// for leftovers.
func (v *verifier) heartbeat(ctx context.Context, db *mongo.Database) (stop func()) {
	c := db.Collection(v.prefix + "_run")
	mark := func() {
		_, _ = c.UpdateOne(ctx, bson.D{{Key: "_id", Value: "run"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "beat", Value: time.Now()}}}},
			options.UpdateOne().SetUpsert(true))
	}
	mark()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(beatEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				mark()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

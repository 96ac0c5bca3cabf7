package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/lease"
)

// leaseResult is one run of the lease contention benchmark.
type leaseResult struct {
	workers   int
	acquired  int
	elapsed   time.Duration
	sent      int64
	waits     []time.Duration // from calling Do to fn running
	gaps      []time.Duration // from one holder's fn returning to the next one's starting
	perWorker []int
}

// leaseRun is the 1-worker and the 8-worker runs, and a round trip.
type leaseRun struct {
	one, eight leaseResult
	rtt        time.Duration
	mode       lease.Mode
}

func runLease(ctx context.Context, srv *server, cs, d time.Duration) (leaseRun, error) {
	db := "mongocas_bench_" + rand.Text()[:8]
	c, err := connect(ctx, srv.uri, db)
	if err != nil {
		return leaseRun{}, err
	}
	defer func() {
		_ = c.coll.Database().Drop(context.Background())
		_ = c.st.Close(context.Background())
	}()
	m, err := lease.New(c.coll, &lease.Options{TTL: 10 * time.Second, Owner: "bench"})
	if err != nil {
		return leaseRun{}, err
	}
	var out leaseRun
	if out.mode, err = m.Mode(ctx); err != nil {
		return out, err
	}
	// One round trip: the median of 21 reads by id.
	var rts []time.Duration
	for range 21 {
		t0 := time.Now()
		if err := c.coll.FindOne(ctx, bson.D{{Key: "_id", Value: "none"}}).Err(); err != nil && ctx.Err() != nil {
			return out, err
		}
		rts = append(rts, time.Since(t0))
	}
	out.rtt = percentile(rts, 0.5)
	for i, workers := range []int{1, 8} {
		r, err := leaseCell(ctx, c, m, workers, cs, d)
		if err != nil {
			return out, err
		}
		if i == 0 {
			out.one = r
		} else {
			out.eight = r
		}
	}
	return out, nil
}

func leaseCell(ctx context.Context, c *client, m *lease.Manager, workers int, cs, d time.Duration) (leaseResult, error) {
	id := "l-" + rand.Text()[:10]
	if _, err := c.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
		return leaseResult{}, err
	}
	// The first claim of a record is not the steady state.
	if err := m.Do(ctx, id, func(context.Context, *lease.Lease) error { return nil }); err != nil {
		return leaseResult{}, err
	}
	c.sent.Store(0)
	r := leaseResult{workers: workers, perWorker: make([]int, workers)}
	var (
		mu      sync.Mutex
		lastEnd time.Time
		wg      sync.WaitGroup
		errs    []error
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				asked := time.Now()
				err := m.Do(ctx, id, func(context.Context, *lease.Lease) error {
					began := time.Now()
					mu.Lock()
					r.waits = append(r.waits, began.Sub(asked))
					if !lastEnd.IsZero() {
						r.gaps = append(r.gaps, began.Sub(lastEnd))
					}
					r.perWorker[w]++
					r.acquired++
					mu.Unlock()
					time.Sleep(cs)
					mu.Lock()
					lastEnd = time.Now()
					mu.Unlock()
					return nil
				})
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	r.sent = c.sent.Load()
	if len(errs) > 0 {
		return r, errs[0]
	}
	return r, nil
}

func printLease(lr leaseRun, cs time.Duration) {
	one, eight := lr.one, lr.eight
	rate := func(r leaseResult) float64 { return float64(r.acquired) / r.elapsed.Seconds() }
	fmt.Printf("Lease contention: Manager.Do on one document, %v critical section (%s; one round trip %v)\n\n", cs, lr.mode, lr.rtt.Round(10*time.Microsecond))
	fmt.Println("| workers | acquisitions /s | vs 1 worker | round trips per acquisition | wait p50 | wait p99 | hand-over gap p99 | max/min work per worker |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range []leaseResult{one, eight} {
		spread := float64(slices.Max(r.perWorker)) / float64(max(slices.Min(r.perWorker), 1))
		fmt.Printf("| %d | %.0f | %.2fx | %.2f | %v | %v | %v | %.2f |\n", r.workers, rate(r), rate(r)/rate(one),
			float64(r.sent)/float64(max(r.acquired, 1)),
			percentile(r.waits, 0.5).Round(100*time.Microsecond), percentile(r.waits, 0.99).Round(100*time.Microsecond),
			percentile(r.gaps, 0.99).Round(100*time.Microsecond), spread)
	}
	fmt.Printf("\nTarget for the hand-over (2 x critical section + one round trip): %v. With %d workers in line, a call waits for the %d ahead of it, so its wait is about %d x (critical section + hand-over).\n",
		(2*cs + lr.rtt).Round(100*time.Microsecond), eight.workers, eight.workers-1, eight.workers-1)
	// Little's law: W callers always in the system at throughput X spend
	// W/X each in it, on average, whatever the order they are served in.
	inSystem := time.Duration(float64(eight.workers) / rate(eight) * float64(time.Second))
	fmt.Printf("Floor for any lock (Little's law): %d workers always asking, at %.0f acquisitions/s, spend %v per call in all, so they wait that less their hold (at least the %v critical section) on average; at any throughput, at least %v (%d x the critical section), whatever the order they are served in.\n\n",
		eight.workers, rate(eight), inSystem.Round(100*time.Microsecond), cs, time.Duration(eight.workers-1)*cs, eight.workers-1)
}

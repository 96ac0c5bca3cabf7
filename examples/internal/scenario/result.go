package scenario

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Row is what every strategy run reports, one line of the demo's table.
type Row struct {
	// Scenario is "inventory", "wallet" or "identity".
	Scenario string `json:"scenario"`
	// Strategy names the way the job was done.
	Strategy string `json:"strategy"`
	// Kind is KindNaive, KindMongocas or KindAntiPattern. The demo fails if
	// a mongocas strategy shows an anomaly or an unexpected error.
	Kind string `json:"kind"`
	// Requests is how many requests (orders, wallet operations, identity
	// switches) were made.
	Requests int `json:"requests"`
	// Anomalies counts what went wrong in the data: oversold items, wallets
	// whose balance is not their opening balance plus the acknowledged
	// changes, interleaved partner-call sequences and corrupted primaries.
	Anomalies int `json:"anomalies"`
	// Errors counts requests that failed in a way the job does not expect
	// (not "sold out", "insufficient funds" or "already in progress").
	Errors int `json:"errors"`
	// Latency is the distribution of the requests' durations.
	Latency Latency `json:"latency"`
	// Elapsed is the run's wall time.
	Elapsed time.Duration `json:"elapsed"`
	// Details are the scenario's facts, one per line.
	Details []string `json:"details"`
}

// Summary returns the row itself; the results that embed a Row answer it
// too.
func (r Row) Summary() Row { return r }

// The kinds of strategy.
const (
	KindNaive       = "naive"
	KindMongocas    = "mongocas"
	KindAntiPattern = "anti-pattern"
)

// Mongocas reports whether the strategy is built on mongocas.
func (r Row) Mongocas() bool { return r.Kind == KindMongocas }

// OK reports whether the row shows neither an anomaly nor an unexpected
// error.
func (r Row) OK() bool { return r.Anomalies == 0 && r.Errors == 0 }

// Latency summarizes request durations.
type Latency struct {
	// N is the number of requests measured.
	N int `json:"n"`
	// P50, P99 and Max are the median, the 99th percentile (nearest rank)
	// and the slowest.
	P50 time.Duration `json:"p50"`
	P99 time.Duration `json:"p99"`
	Max time.Duration `json:"max"`
}

// recorder collects request durations from many goroutines.
type recorder struct {
	mu sync.Mutex
	d  []time.Duration
}

// time runs fn and records how long it took.
func (r *recorder) time(fn func()) {
	start := time.Now()
	fn()
	r.add(time.Since(start))
}

// add records one duration.
func (r *recorder) add(d time.Duration) {
	r.mu.Lock()
	r.d = append(r.d, d)
	r.mu.Unlock()
}

func (r *recorder) latency() Latency {
	r.mu.Lock()
	defer r.mu.Unlock()
	return percentiles(r.d)
}

// percentiles returns the nearest-rank P50 and P99 and the maximum of d.
func percentiles(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := func(p int) time.Duration {
		i := (p*len(s)+99)/100 - 1 // nearest rank: ceil(p/100 × n), 1-based
		return s[max(i, 0)]
	}
	return Latency{N: len(s), P50: rank(50), P99: rank(99), Max: s[len(s)-1]}
}

// progress prints a line now and then while a run that has lasted more than
// a few seconds goes on, so a slow server does not look like a hang.
type progress struct {
	label string
	total int
	done  atomic.Int64
	stop  chan struct{}
	wg    sync.WaitGroup
}

// progressAfter is how long a run may last before progress lines appear,
// and progressEvery the interval between them.
const (
	progressAfter = 3 * time.Second
	progressEvery = 3 * time.Second
)

// startProgress starts reporting to w (nothing when w is nil).
func startProgress(w io.Writer, label string, total int) *progress {
	p := &progress{label: label, total: total, stop: make(chan struct{})}
	if w == nil {
		return p
	}
	start := time.Now()
	p.wg.Go(func() {
		t := time.NewTimer(progressAfter)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				fmt.Fprintf(w, "  … %s: %d/%d requests done, %.0fs\n", p.label, p.done.Load(), p.total, time.Since(start).Seconds())
				t.Reset(progressEvery)
			}
		}
	})
	return p
}

// add counts one finished request.
func (p *progress) add() { p.done.Add(1) }

// end stops reporting.
func (p *progress) end() {
	close(p.stop)
	p.wg.Wait()
}

// forEach runs fn(i) for i in [0, n) on at most workers goroutines (all at
// once when workers <= 0), counting each finished call on p.
func forEach(n, workers int, p *progress, fn func(i int)) {
	if workers <= 0 || workers > n {
		workers = n
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				fn(i)
				p.add()
			}
		})
	}
	wg.Wait()
}

// warmUp opens n connections to db's server before a run is timed, so that
// the first strategy does not pay for the pool's growth.
func warmUp(ctx context.Context, db *mongo.Database, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { _ = db.RunCommand(ctx, bson.D{{Key: "ping", Value: 1}}).Err() })
	}
	wg.Wait()
}

// Command bench measures read-modify-write under contention on one document,
// and lease contention, against a MongoDB-wire server in another process, in
// one bounded run:
//
//	go run ./internal/bench                 # embedded FerretDB in a child process
//	go run ./internal/bench -uri mongodb://127.0.0.1:27018/
//	make bench-contention
//
// For N = 1, 2, 4, 8, 16, 32 writers, in one process and in 4 processes of
// N/4 writers each (4 clients of their own, which the server and the
// library see as 4 processes), each strategy increments one counter for
// -cell: versioned.Modify, versioned.Guarded, a raw-driver CAS loop with no
// backoff, and docstore's strategy (a revision field, read-modify-write, a
// conditional update, and on a failed precondition the same backoff as
// Modify), written with the raw driver. It reports round trips per success,
// goodput against one writer, the p99 latency of a call and the calls that
// gave up, checks that every counter is exact, prints the tables and writes
// a PNG plot. Then 8 contenders run lease.Manager.Do on one document with a
// short critical section: the wait for the lease, the hand-over gap, round
// trips per acquisition and the spread of work between workers.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/mongocas/mongocas/mongotest"
)

func main() {
	var (
		uri      = flag.String("uri", "", "server to measure (default $MONGODB_URI; when both are empty, embedded FerretDB in a child process)")
		cell     = flag.Duration("cell", time.Second, "how long each strategy runs at each N, per run")
		ns       = flag.String("n", "1,2,4,8,16,32", "writer counts")
		leaseCS  = flag.Duration("lease-cs", 3*time.Millisecond, "critical section of the lease contention run")
		png      = flag.String("png", "bench.png", "where to write the plot (empty: none)")
		limit    = flag.Duration("timeout", 15*time.Minute, "bound on the whole run")
		only     = flag.String("only", "", "comma-separated strategies to run (default all)")
		runs     = flag.Int("runs", 3, "runs of each cell; the tables show the median by goodput")
		skipRMW  = flag.Bool("no-rmw", false, "skip the read-modify-write tables")
		skipLeas = flag.Bool("no-lease", false, "skip the lease contention table")
	)
	flag.Parse()
	if err := run(*uri, *cell, *ns, *leaseCS, *png, *limit, *only, max(*runs, 1), *skipRMW, *skipLeas); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(uri string, cell time.Duration, nsFlag string, leaseCS time.Duration, png string, limit time.Duration, only string, runs int, skipRMW, skipLease bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var counts []int
	for s := range strings.SplitSeq(nsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("bad -n %q", nsFlag)
		}
		counts = append(counts, n)
	}
	srv, err := openServer(ctx, uri)
	if err != nil {
		return err
	}
	defer srv.close()
	fmt.Printf("server: %s\n", srv.where)
	fmt.Printf("machine: %s/%s, %d CPUs, load %s, %s\n\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadAvg(), time.Now().UTC().Format("2006-01-02 15:04 MST"))

	if !skipRMW {
		strategies := allStrategies
		if only != "" {
			strategies = nil
			for _, s := range allStrategies {
				if strings.Contains(","+only+",", ","+s.name+",") {
					strategies = append(strategies, s)
				}
			}
		}
		res, err := runRMW(ctx, srv, strategies, counts, cell, runs)
		if err != nil {
			return err
		}
		printRMW(res, strategies, counts)
		if png != "" {
			if err := plot(png, res, strategies, counts); err != nil {
				return err
			}
			fmt.Printf("plot: %s\n\n", png)
		}
	}
	if !skipLease {
		lr, err := runLease(ctx, srv, leaseCS, 3*cell)
		if err != nil {
			return err
		}
		printLease(lr, leaseCS)
	}
	return nil
}

// server is where the benchmark runs: a URI, or mongotest's embedded
// FerretDB in a child process (so that what this process allocates is the
// client's).
type server struct {
	uri   string
	where string
	close func()
}

func openServer(ctx context.Context, uri string) (*server, error) {
	if uri == "" {
		uri = os.Getenv(mongotest.EnvURI)
	}
	if uri != "" {
		return &server{uri: uri, where: uri, close: func() {}}, nil
	}
	if os.Getenv(mongotest.EnvEmbedded) == "" {
		_ = os.Setenv(mongotest.EnvEmbedded, "process")
	}
	s, err := mongotest.Start(ctx)
	if err != nil {
		return nil, err
	}
	return &server{
		uri:   s.URI,
		where: fmt.Sprintf("%s (%s, %s)", s.Backend, s.Embedded, s.Caps),
		close: mongotest.Shutdown,
	}, nil
}

// loadAvg is the machine's load average, as /proc says.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// Package cli is the shared main of the example programs: flags, a fresh
// database (the -uri server or the embedded default), the scenario, the
// table, and an exit status that is non-zero when a mongocas strategy went
// wrong. Demo runs the example programs themselves and prints one table.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/mongocas/mongocas/examples/internal/exampledb"
	"github.com/mongocas/mongocas/examples/internal/scenario"
	"github.com/mongocas/mongocas/observe"
)

// options are the flags every program has besides its scenario's.
type options struct {
	uri     *string
	timeout *time.Duration
	seed    *uint64
}

// newFlagSet returns the flag set of a program called name, with the flags
// of scenarios and the common ones.
func newFlagSet(name, about string, stderr io.Writer, scenarios ...scenario.Scenario) (*flag.FlagSet, options) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./examples/%s [flags]\n\n%s\n\nflags:\n", name, about)
		fs.PrintDefaults()
	}
	for _, sc := range scenarios {
		sc.RegisterFlags(fs)
	}
	return fs, options{
		uri:     exampledb.URIFlag(fs),
		timeout: fs.Duration("timeout", 5*time.Minute, "give up after this long"),
		seed:    fs.Uint64("seed", 1, "seed of the generated operations and of the partner's latencies and failures"),
	}
}

// run is a started program: its context (ended by an interrupt or
// -timeout) and its fresh database.
type run struct {
	ctx   context.Context
	db    *exampledb.DB
	start time.Time
	end   func()
}

// begin parses args into fs, starts the context and opens the database of
// the program called name. When ok is false the program ends with code;
// otherwise it calls r.end when done.
func begin(name string, fs *flag.FlagSet, opt options, args []string, stderr io.Writer) (r *run, code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0, false
		}
		return nil, 2, false
	}
	r = &run{start: time.Now()}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	ctx, cancel := context.WithTimeout(ctx, *opt.timeout)
	db, err := exampledb.Open(ctx, *opt.uri, name)
	if err != nil {
		cancel()
		stop()
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return nil, 1, false
	}
	r.ctx, r.db = ctx, db
	r.end = func() {
		if err := db.Close(); err != nil {
			fmt.Fprintf(stderr, "%s: clean up: %v\n", name, err)
		}
		cancel()
		stop()
	}
	return r, 0, true
}

// Main runs sc as the program called name with the command line args, and
// returns the exit status: 0 when every mongocas strategy showed no anomaly
// and no error, 1 otherwise, 2 for a bad command line. With -json it prints
// the report as JSON instead of the table, for Demo. events, if not nil, is
// the Observer of the program's mongocas strategy: its counts go under the
// table.
func Main(name, about string, args []string, stdout, stderr io.Writer, sc scenario.Scenario, events *observe.Counters) int {
	fs, opt := newFlagSet(name, about, stderr, sc)
	asJSON := fs.Bool("json", false, "print the report as JSON instead of the table (the demo reads it)")
	r, code, ok := begin(name, fs, opt, args, stderr)
	if !ok {
		return code
	}
	defer r.end()
	if !*asJSON {
		fmt.Fprintf(stdout, "%s on %s\n\n", name, r.db.Where)
	}
	rep := &scenario.Report{}
	if err := sc.Run(r.ctx, scenario.Env{DB: r.db.Database, Caps: r.db.Caps, Seed: *opt.seed, Progress: stderr, URI: r.db.URI}, rep); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	if events != nil {
		rep.AddEvents(events.Counts())
	}
	if *asJSON {
		if err := writeJSON(stdout, rep); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 1
		}
	} else {
		rep.Print(stdout)
		fmt.Fprintf(stdout, "(%.1fs)\n", time.Since(r.start).Seconds())
	}
	if !rep.OK() {
		return 1
	}
	return 0
}

// Package cli is the shared main of the example programs: flags, a fresh
// database (the -uri server or the embedded default), the scenarios, the
// table, and an exit status that is non-zero when a mongocas strategy went
// wrong.
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
)

// Main runs the named scenarios as a program called name with the command
// line args, and returns the exit status: 0 when every mongocas strategy
// showed no anomaly and no error, 1 otherwise, 2 for a bad command line.
func Main(name, about string, args []string, stdout, stderr io.Writer, scenarios ...string) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./examples/%s [flags]\n\n%s\n\nflags:\n", name, about)
		fs.PrintDefaults()
	}
	var cfg scenario.Config
	cfg.RegisterFlags(fs, scenarios...)
	uri := exampledb.URIFlag(fs)
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg.Progress = stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	start := time.Now()
	db, err := exampledb.Open(ctx, *uri, name)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	defer func() {
		if err := db.Close(); err != nil {
			fmt.Fprintf(stderr, "%s: clean up: %v\n", name, err)
		}
	}()
	fmt.Fprintf(stdout, "%s on %s\n\n", name, db.Where)
	rep, err := scenario.RunDemo(ctx, db.Database, db.Caps, cfg, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	fmt.Fprintf(stdout, "(%.1fs)\n", time.Since(start).Seconds())
	if !rep.OK() {
		return 1
	}
	return 0
}

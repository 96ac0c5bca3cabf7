package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

// devUsage is dev's part of the usage text.
const devUsage = `mongocas dev [--db NAME]: start a MongoDB-wire server for development and
print its URI, until Ctrl-C (SIGINT or SIGTERM) stops it and removes its data.
The server is the one mongotest gives tests, in the same order: the server at
MONGODB_URI when that is set (nothing is started then), else MongoDB in Docker
when an engine answers, else the embedded server (FerretDB v1 in a child
process behind a proxy that serializes requests; built with the go command on
first use, cached in the user cache directory). MONGOCAS_BACKEND forces one.
The URI's path names the database NAME (default "dev"), so the other
subcommands need no --db.
`

// devInfo is what dev prints with --json.
type devInfo struct {
	Backend string `json:"backend"`
	Server  string `json:"server"`
	URI     string `json:"uri"`
	Export  string `json:"export,omitempty"`
	DataDir string `json:"data_dir,omitempty"`
	Started bool   `json:"started"`
}

// dev starts the server mongotest would, prints its URI, and waits for
// SIGINT or SIGTERM (or ctx) to stop it.
func (c *cli) dev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() { fmt.Fprint(c.out, devUsage) }
	db := fs.String("db", "dev", "the database the printed URI names")
	fs.BoolVar(&c.json, "json", false, "machine-readable output")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return usageErr("%v", err)
	}
	if fs.NArg() > 0 {
		return usageErr("dev takes no arguments, got %q", fs.Args())
	}
	if *db == "" || strings.ContainsAny(*db, `/\. "$`) {
		return usageErr("--db %q: a database name has none of / \\ . space \" $", *db)
	}

	// Ctrl-C in a terminal reaches the whole process group: the embedded
	// server's child process may stop first, and Shutdown below still
	// removes its data directory.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintln(c.errw, "mongocas dev: starting a server (MONGODB_URI, else Docker, else the embedded server)...")
	srv, err := mongotest.Start(ctx)
	if err != nil {
		if ctx.Err() != nil {
			mongotest.Shutdown()
			return fail(errors.New("interrupted while starting: nothing left running"), "run it again and let it finish starting")
		}
		return fail(err, "see the message above; MONGOCAS_BACKEND=embedded forces the embedded server")
	}
	defer mongotest.Shutdown()

	info, err := devReport(srv, *db)
	if err != nil {
		return fail(err, "report this: mongotest gave a URI that does not parse")
	}
	if !info.Started {
		if c.json {
			return c.printJSON(info)
		}
		fmt.Fprintf(c.out, "MONGODB_URI names a server already, and it answers: %s\nnothing started; unset MONGODB_URI to start one\n", srv)
		return nil
	}
	if c.json {
		if err := c.printJSON(info); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.out, "server: %s\n", srv)
		fmt.Fprintf(c.out, "uri: %s\n", info.URI)
		if srv.Dir != "" {
			fmt.Fprintf(c.out, "data: %s (removed when this stops)\n", srv.Dir)
		}
		fmt.Fprintf(c.out, "in another shell:\n%s\n", info.Export)
		fmt.Fprintln(c.out, "Ctrl-C stops the server and removes its data.")
	}
	<-ctx.Done()
	fmt.Fprintln(c.errw, "mongocas dev: stopping the server and removing its data")
	mongotest.Shutdown()
	if srv.Dir != "" {
		if _, err := os.Stat(srv.Dir); !errors.Is(err, os.ErrNotExist) {
			return fail(fmt.Errorf("the data directory %s is still there after the server stopped", srv.Dir), "remove it by hand")
		}
	}
	fmt.Fprintln(c.errw, "mongocas dev: stopped")
	return nil
}

// devReport says what dev started: the URI, naming the database db, and the
// line that exports it. When MONGODB_URI names a server already, nothing was
// started (starting another would leave that variable naming the wrong one):
// its URI is the user's, as given, and may hold a password, so it is shown
// redacted and not exported.
func devReport(srv *mongotest.Server, db string) (devInfo, error) {
	info := devInfo{Backend: string(srv.Backend), Server: srv.String(), DataDir: srv.Dir,
		Started: srv.Backend != mongotest.BackendURI}
	if !info.Started {
		info.URI = store.RedactURI(srv.URI)
		return info, nil
	}
	uri, err := withDatabase(srv.URI, db)
	if err != nil {
		return devInfo{}, err
	}
	info.URI, info.Export = uri, "export MONGODB_URI='"+uri+"'"
	return info, nil
}

// withDatabase returns uri with its path naming the database db.
func withDatabase(uri, db string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", err
	}
	u.Path = "/" + db
	u.RawPath = ""
	return u.String(), nil
}

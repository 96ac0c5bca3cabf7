package mongotest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mongocas/mongocas/store"
)

// EnvAltURI names a second server for the tests that need a capability the
// shared one lacks (NewWith): the embedded FerretDB v1 has no $expr, $$NOW
// in writes, update pipelines or TTL indexes, which FerretDB v2 on
// DocumentDB and MongoDB have. When it is unset, NewWith reads the URI
// recorded in the file AltURIFile of the user cache directory's mongocas
// folder (make documentdb-up writes it when it starts a DocumentDB backend
// on this machine), and uses it if the server answers.
const EnvAltURI = "MONGOCAS_ALT_URI"

// AltURIFile is the file, in the mongocas folder of the user cache
// directory, that holds the URI of a second server running on this machine.
const AltURIFile = "alt-server.uri"

var (
	altMu     sync.Mutex
	altServer *Server
	errAlt    error
	altTried  bool
	altWhere  string
)

// NewWith is New on a server that has every capability in caps (see Use).
func NewWith(t testing.TB, caps ...Capability) *DB {
	t.Helper()
	Use(t, caps...)
	return New(t)
}

// Use makes New, for t and its subtests, return databases on a server that
// has every capability in caps: the shared server when it has them; else
// the second server named by MONGOCAS_ALT_URI, or recorded on this machine
// (see EnvAltURI), when it has them. Otherwise t is skipped, saying what is
// missing and how to run it. So a plain go test on a machine where a second
// backend runs covers what the first one cannot (the lease package's
// server-judged mode, for one), and one without it says how to get it.
func Use(t testing.TB, caps ...Capability) {
	t.Helper()
	shared := serverFor(t)
	if len(shared.lacks(caps)) == 0 {
		return
	}
	alt, where, err := altStart()
	switch {
	case err != nil:
		t.Fatalf("mongotest: the second server %s: %v", where, err)
	case alt == nil:
		t.Skipf("mongotest: needs %s, which the %s backend lacks, and no second server is known: "+
			"set %s to a server that has it (FerretDB v2 on DocumentDB, MongoDB), or run make documentdb-up "+
			"where the DocumentDB kit is, or run the suite with %s set to such a server",
			strings.Join(capNames(shared.lacks(caps)), ", "), shared.Backend, EnvAltURI, EnvURI)
	}
	if missing := alt.lacks(caps); len(missing) > 0 {
		t.Skipf("mongotest: needs %s, which neither the %s backend nor the second server %s has",
			strings.Join(capNames(missing), ", "), shared.Backend, where)
	}
	name := t.Name()
	routes.Store(name, alt)
	t.Cleanup(func() { routes.Delete(name) })
}

// routes maps a test's name to the server Use chose for it and its
// subtests.
var routes sync.Map

// routed returns the server Use chose for the test named name or one of its
// parents, if any.
func routed(name string) *Server {
	for {
		if s, ok := routes.Load(name); ok {
			return s.(*Server) //nolint:forcetypeassert // routes holds only *Server
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return nil
		}
		name = name[:i]
	}
}

// serverFor returns the server New uses for t: the one Use chose, or the
// shared one (started on first use; t fails if none can be had).
func serverFor(t testing.TB) *Server {
	t.Helper()
	if s := routed(t.Name()); s != nil {
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	s, err := Start(ctx)
	if err != nil {
		t.Fatal(err) // it says "mongotest: no MongoDB-wire server: ..." and the fix
	}
	return s
}

// lacks returns the capabilities of caps that s does not have.
func (s *Server) lacks(caps []Capability) []Capability {
	var out []Capability
	for _, c := range caps {
		if !s.Has(c) {
			out = append(out, c)
		}
	}
	return out
}

func capNames(caps []Capability) []string {
	out := make([]string, len(caps))
	for i, c := range caps {
		out[i] = string(c)
	}
	return out
}

// altStart connects to the second server once per process: the URI of
// MONGOCAS_ALT_URI, else the one recorded in the cache directory if it
// answers within two seconds. It returns nil, with no error, when there is
// none; an error when MONGOCAS_ALT_URI names one that cannot be reached.
func altStart() (*Server, string, error) {
	altMu.Lock()
	defer altMu.Unlock()
	if altTried {
		return altServer, altWhere, errAlt
	}
	altTried = true
	uri, where := os.Getenv(EnvAltURI), EnvAltURI
	wait := 30 * time.Second
	if uri == "" {
		dir, err := cacheDir()
		if err != nil {
			return nil, "", nil // no cache directory: no recorded server
		}
		path := filepath.Join(dir, AltURIFile)
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, "", nil // nothing recorded
		}
		uri, where, wait = strings.TrimSpace(string(b)), path, 2*time.Second
	}
	altWhere = "(" + where + ")"
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	s, err := startURI(ctx, uri)
	if err != nil {
		if where != EnvAltURI {
			// A recorded server that is not running any more: as if none.
			return nil, "", nil
		}
		errAlt = errors.Join(fmt.Errorf("%s=%s", EnvAltURI, store.RedactURI(uri)), err)
		return nil, altWhere, errAlt
	}
	altServer = s
	if testing.Testing() {
		noticef("mongotest: %s: a second server, for the tests that need what the first lacks: %s (%s)", binaryName(), store.RedactURI(uri), s.Caps)
	}
	return s, altWhere, nil
}

// open returns a fresh database on s for t, dropped when t ends.
func open(t testing.TB, s *Server) *DB {
	t.Helper()
	db := s.Client.Database(dbName(t.Name()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := db.Drop(ctx); err != nil {
			t.Errorf("mongotest: drop database %s: %v", db.Name(), err)
		}
	})
	return &DB{Database: db, Server: s}
}

// shutdownAlt disconnects from the second server, if one was used.
func shutdownAlt() {
	altMu.Lock()
	defer altMu.Unlock()
	if altServer != nil {
		altServer.stop()
	}
	altServer, errAlt, altTried = nil, nil, false
}

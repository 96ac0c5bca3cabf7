package mongotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.uber.org/goleak"

	"github.com/mongocas/mongocas/store"
)

// DB is a fresh database on the shared server, for one test. It is dropped
// when the test ends.
type DB struct {
	// Database is the fresh database.
	*mongo.Database
	// Server is the shared server the database lives on.
	Server *Server
}

// StartTimeout bounds how long New waits for the shared server on first use.
// The embedded backend starts in milliseconds; the Docker backend may have to
// pull an image.
var StartTimeout = 3 * time.Minute

// New returns a fresh, empty database on the shared server (see Start) and
// drops it when t ends. If no server can be had, t fails with the reason.
//
// Within a test (or a parent test) that called Use, the database is on the
// server Use chose.
func New(t testing.TB) *DB {
	t.Helper()
	return open(t, serverFor(t))
}

// Open is New for code that is not a test, such as examples and demos: it
// returns a fresh database whose name starts with a sanitized form of label,
// and the function that drops it.
func Open(ctx context.Context, label string) (*DB, func(context.Context) error, error) {
	s, err := Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	db := s.Client.Database(dbName(label))
	return &DB{Database: db, Server: s}, db.Drop, nil
}

// Caps returns what the server can do.
func (d *DB) Caps() store.Capabilities { return d.Server.Caps }

// Capability names a feature a test may need.
type Capability string

// The capabilities Require understands.
const (
	Transactions    Capability = "transactions"
	RetryableWrites Capability = "retryable writes"
	Expr            Capability = "$expr/$$NOW"
	UpdatePipelines Capability = "update pipelines"
	TTLIndexes      Capability = "TTL indexes"
	Faults          Capability = "fault injection"
)

// Has reports whether the server has the capability.
func (s *Server) Has(c Capability) bool {
	switch c {
	case Transactions:
		return s.Caps.Transactions
	case RetryableWrites:
		return s.Caps.RetryableWrites
	case Expr:
		return s.Caps.Expr
	case UpdatePipelines:
		return s.Caps.UpdatePipelines
	case TTLIndexes:
		return s.Caps.TTLIndexes
	case Faults:
		return s.upstream != ""
	}
	return false
}

// Require skips t, saying which capability the backend lacks, unless the
// server has every one given. A skipped test is reported as skipped, never
// as passed.
func (d *DB) Require(t testing.TB, caps ...Capability) {
	t.Helper()
	for _, c := range caps {
		if !d.Server.Has(c) {
			t.Skipf("mongotest: the %s backend (%s) lacks %s", d.Server.Backend, d.Server.Caps, c)
		}
	}
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9_]+`)

// dbName makes a database name that is unique, valid on MongoDB and FerretDB
// (letters, digits, underscore; at most 63 bytes) and still shows the test.
func dbName(test string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	base := unsafeName.ReplaceAllString(test, "_")
	base = strings.Trim(base, "_")
	const maxBase = 63 - len("t__") - 8
	if len(base) > maxBase {
		base = base[len(base)-maxBase:]
	}
	return "t_" + hex.EncodeToString(b[:]) + "_" + base
}

// Main runs the tests of a package, then stops the shared server and removes
// its files. Call it from TestMain:
//
//	func TestMain(m *testing.M) { mongotest.Main(m) }
//
// With [CheckLeaks] it also fails the run if any goroutine is still running
// after the tests and the shutdown (goleak): a test that leaks a goroutine, or
// a library call that leaves one behind, is caught even when every test
// passed. It is off by default, since it judges every goroutine of the whole
// test binary, the caller's own included:
//
//	func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }
func Main(m *testing.M, opts ...MainOption) {
	var o mainOptions
	for _, opt := range opts {
		opt(&o)
	}
	code := m.Run()
	Shutdown()
	if code == 0 && o.checkLeaks {
		if err := goleak.Find(o.leakOpts...); err != nil {
			fmt.Fprintf(os.Stderr, "mongotest: goroutines left running after the tests and Shutdown: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// MainOption tunes [Main].
type MainOption func(*mainOptions)

type mainOptions struct {
	checkLeaks bool
	leakOpts   []goleak.Option
}

// CheckLeaks makes [Main] fail the run when goroutines are left running after
// the tests and the shutdown of the shared server. A goroutine whose top
// function (the one it is running, as goleak reports it) is named in
// ignoreTopFunctions, such as "go.opencensus.io/stats/view.(*worker).start",
// is not counted.
func CheckLeaks(ignoreTopFunctions ...string) MainOption {
	return func(o *mainOptions) {
		o.checkLeaks = true
		for _, f := range ignoreTopFunctions {
			o.leakOpts = append(o.leakOpts, goleak.IgnoreTopFunction(f))
		}
	}
}

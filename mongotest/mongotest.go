package mongotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.uber.org/goleak"

	"github.com/mongocas/mongocas/internal/wireproxy"
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
func New(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	db, drop, err := Open(ctx, t.Name())
	if err != nil {
		t.Fatalf("mongotest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := drop(ctx); err != nil {
			t.Errorf("mongotest: drop database %s: %v", db.Name(), err)
		}
	})
	return db
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

// Faulty is a second client to a test's database whose traffic passes through
// a proxy of its own, where faults can be injected without touching other
// tests. On the embedded backend the proxy shares the serializing lock, so
// the single-document atomicity model holds for its traffic too.
type Faulty struct {
	// Database is the test's database, reached through the fault proxy.
	*mongo.Database
	// Client is the client behind Database. It is disconnected at cleanup.
	Client *mongo.Client

	proxy *wireproxy.Proxy
}

// FaultyOptions configures Faulty. A nil *FaultyOptions means defaults.
type FaultyOptions struct {
	// RetryWrites turns the driver's retryable writes on. Default off, so
	// that a dropped reply reaches the code under test as the ambiguous
	// network error it is, on every backend.
	RetryWrites bool
	// ClientOptions are applied last, to override anything.
	ClientOptions *options.ClientOptions
}

// Faulty returns a client to d's database through a fresh fault proxy, closed
// when t ends. It skips t when the backend's traffic cannot go through a
// plain TCP proxy (a TLS or SRV MONGODB_URI).
func (d *DB) Faulty(t testing.TB, opts *FaultyOptions) *Faulty {
	t.Helper()
	d.Require(t, Faults)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	f, err := d.OpenFaulty(ctx, opts)
	if err != nil {
		t.Fatalf("mongotest: %v", err)
	}
	t.Cleanup(f.Close)
	return f
}

// ErrNoFaults is returned by OpenFaulty when the backend's traffic cannot go
// through a plain TCP proxy (a TLS or SRV MONGODB_URI).
var ErrNoFaults = errors.New("mongotest: fault injection needs a plain TCP server")

// OpenFaulty is Faulty for code that is not a test. Call Close when done.
func (d *DB) OpenFaulty(ctx context.Context, opts *FaultyOptions) (*Faulty, error) {
	if !d.Server.Has(Faults) {
		return nil, ErrNoFaults
	}
	if opts == nil {
		opts = &FaultyOptions{}
	}
	p, err := wireproxy.New(wireproxy.Config{Upstream: d.Server.upstream, Serializer: d.Server.serializer})
	if err != nil {
		return nil, fmt.Errorf("fault proxy: %w", err)
	}
	uri := "mongodb://" + p.Addr() + "/?directConnection=true"
	co := store.ClientOptions(uri, &store.Options{AppName: "mongocas-test-faulty", ServerSelectionTimeout: 10 * time.Second}).
		SetRetryWrites(opts.RetryWrites).
		SetRetryReads(opts.RetryWrites)
	if opts.ClientOptions != nil {
		co = options.MergeClientOptions(co, opts.ClientOptions)
	}
	client, err := mongo.Connect(co)
	if err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("fault client: %w", err)
	}
	f := &Faulty{Database: client.Database(d.Name()), Client: client, proxy: p}
	if err := client.Ping(ctx, readpref.Primary()); err != nil {
		f.Close()
		return nil, fmt.Errorf("fault client ping: %w", err)
	}
	return f, nil
}

// Close disconnects the client and closes the proxy.
func (f *Faulty) Close() {
	_ = f.Client.Disconnect(context.Background())
	_ = f.proxy.Close()
}

// Command is a request seen by the fault proxy: its name, target collection,
// database, body and document sequences.
type Command = wireproxy.Command

// Match selects the commands a fault applies to. A nil Match matches every
// command.
type Match func(*Command) bool

// Writes matches insert, update, delete and findAndModify commands,
// optionally only on the named collections.
func Writes(collections ...string) Match {
	return Commands([]string{"insert", "update", "delete", "findAndModify"}, collections...)
}

// Commands matches the named commands (case-insensitive), optionally only on
// the named collections.
func Commands(names []string, collections ...string) Match {
	return func(c *Command) bool {
		ok := false
		for _, n := range names {
			if strings.EqualFold(c.Name, n) {
				ok = true
				break
			}
		}
		if !ok || len(collections) == 0 {
			return ok
		}
		return slices.Contains(collections, c.Collection)
	}
}

// Fault is an armed fault. Fired is closed when it has acted as often as it
// was armed for.
type Fault struct {
	f *Faulty
	t *wireproxy.Trigger
}

// Fired is closed once the fault has acted.
func (f *Fault) Fired() <-chan struct{} { return f.t.Fired() }

// HasFired reports whether the fault has acted as often as it was armed for.
func (f *Fault) HasFired() bool {
	select {
	case <-f.t.Fired():
		return true
	default:
		return false
	}
}

// Dropped returns the commands whose replies the fault dropped so far.
func (f *Fault) Dropped() []*Command { return f.f.proxy.Dropped(f.t) }

// DropNextReply arms an ambiguous write: the next request that matches is
// sent to the server and applied, its reply is discarded and the connection
// closed, so the client gets a network error for a change that happened.
func (f *Faulty) DropNextReply(match Match) *Fault { return f.DropReplies(1, match) }

// DropReplies is DropNextReply for the next n matching requests.
func (f *Faulty) DropReplies(n int, match Match) *Fault {
	return &Fault{f: f, t: f.proxy.DropReplies(n, match)}
}

// DelayReplies holds every reply to a matching request for d, until stop is
// called (cleanup calls it too).
func (f *Faulty) DelayReplies(d time.Duration, match Match) (stop func()) {
	return f.proxy.DelayReplies(d, match)
}

// Pause holds all of this client's traffic, requests and replies, for d from
// now. It returns at once; operations sent meanwhile wait (or time out by
// their context).
func (f *Faulty) Pause(d time.Duration) { f.proxy.Pause(d) }

// ResetConnections closes every connection of this client, mid-request or
// idle, and returns how many it closed.
func (f *Faulty) ResetConnections() int { return f.proxy.ResetConnections() }

// Requests returns how many requests passed through the proxy.
func (f *Faulty) Requests() int64 { return f.proxy.Requests() }

// Main runs the tests of a package, stops the shared server, removes its
// files, and then fails the run if any goroutine is still running (goleak):
// a test that leaks a goroutine, or a library call that leaves one behind,
// is caught even when every test passed. Call it from TestMain:
//
//	func TestMain(m *testing.M) { mongotest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	Shutdown()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "mongotest: goroutines left running after the tests and Shutdown: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

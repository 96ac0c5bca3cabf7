package mongotest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/mongocas/mongocas/internal/wireproxy"
	"github.com/mongocas/mongocas/store"
)

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

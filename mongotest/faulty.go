package mongotest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/mongocas/mongocas/mongotest/internal/wireproxy"
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
	// Unserialized lets this client's exchanges run at the server at once,
	// without the embedded backend's serializing lock: FerretDB v1 then
	// applies concurrent conditional updates non-atomically (see the package
	// documentation), a broken server for tools that must detect one. No
	// effect on other backends.
	Unserialized bool
	// RetryWrites turns the driver's retryable writes on. Default off, so
	// that a dropped reply reaches the code under test as the ambiguous
	// network error it is, on every backend.
	RetryWrites bool
	// ClientOptions are applied last, to override anything.
	ClientOptions *options.ClientOptions
}

// Faulty returns a client to d's database through a fresh fault proxy, closed
// when t ends. If the proxy refused traffic it cannot keep serialized or
// inspect (see Faulty.Err), t fails at cleanup. It skips t when the backend's traffic cannot go through a
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
	t.Cleanup(func() {
		f.Close()
		if err := f.Err(); err != nil {
			t.Errorf("mongotest: the fault proxy refused traffic: %v", err)
		}
	})
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
	serializer := d.Server.serializer
	if opts != nil && opts.Unserialized {
		serializer = nil
	}
	p, err := wireproxy.New(wireproxy.Config{Upstream: d.Server.upstream, Serializer: serializer})
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
// command. A fault's Match runs where the fault acts: for the faults on a
// reply (DropNextReply, DropReplies, WriteConcernErrorNext, ErrorAfterApply)
// after the server applied the command and before its client hears of it,
// so a test may use it as a hook for what happens "meanwhile"; for HoldNext
// and ErrorBeforeApply before the command reaches the server.
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

// Dropped returns the commands the fault acted on so far: for DropNextReply
// and DropReplies, those whose replies it dropped. It is Matched under the
// name it had first.
func (f *Fault) Dropped() []*Command { return f.f.proxy.Dropped(f.t) }

// Matched returns the commands the fault acted on so far, in order.
func (f *Fault) Matched() []*Command { return f.f.proxy.Matched(f.t) }

// DropNextReply arms an ambiguous write: the next request that matches is
// sent to the server and applied, its reply is discarded and the connection
// closed, so the client gets a network error for a change that happened.
func (f *Faulty) DropNextReply(match Match) *Fault { return f.DropReplies(1, match) }

// DropReplies is DropNextReply for the next n matching requests.
func (f *Faulty) DropReplies(n int, match Match) *Fault {
	return &Fault{f: f, t: f.proxy.DropReplies(n, match)}
}

// DelayReplies holds every reply to a matching request for d, until stop is
// called (Close and cleanup call it too). Stop also ends at once the delay
// of every reply being held: it goes on to the client.
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

// Err returns what the fault proxy refused, or nil: traffic it cannot keep
// serialized or inspect (a server streaming exhaust replies, compressed or
// legacy messages), for which the client got an error reply whose errmsg
// starts with "wireproxy: refused" and its connection was closed. Faulty
// fails the test at cleanup when Err is not nil.
func (f *Faulty) Err() error { return f.proxy.Err() }

// ErrNothingHeld is returned by Fault.Deliver when there is no held copy to
// deliver: the fault has not fired yet, or its copy was delivered already.
var ErrNothingHeld = wireproxy.ErrNothingHeld

// ServerError is an error reply a fault sends instead of the server's
// reply: {ok: 0, code, codeName, errmsg, errorLabels}.
type ServerError struct {
	// Code is the server error code, such as 10107 (NotWritablePrimary).
	Code int32
	// CodeName is the code's name, such as "NotWritablePrimary".
	CodeName string
	// Errmsg is the error message. Default "mongotest: injected <CodeName>".
	Errmsg string
	// ErrorLabels are the reply's errorLabels, such as
	// "RetryableWriteError". None by default.
	ErrorLabels []string
}

// NotWritablePrimary is the reply of a primary that stepped down before it
// applied the write: code 10107, labelled RetryableWriteError as a server
// labels it for a client that uses retryable writes.
func NotWritablePrimary() ServerError {
	return ServerError{
		Code: 10107, CodeName: "NotWritablePrimary", Errmsg: "not primary",
		ErrorLabels: []string{"RetryableWriteError"},
	}
}

// WriteConcernError is the writeConcernError a fault adds to the reply of a
// write the server applied.
type WriteConcernError struct {
	// Code is the error code, such as 64 (WriteConcernFailed) or 189
	// (PrimarySteppedDown).
	Code int32
	// CodeName is the code's name.
	CodeName string
	// Errmsg is the error message. Default "mongotest: injected <CodeName>".
	Errmsg string
	// ErrInfo, when not nil, is the writeConcernError's errInfo document,
	// such as {wtimeout: true}.
	ErrInfo bson.D
	// ErrorLabels are added to the reply's top-level errorLabels, where a
	// server puts them (for example "RetryableWriteError" for a primary that
	// stepped down while waiting for the write concern). None by default.
	ErrorLabels []string
}

// WriteConcernTimeout is the writeConcernError of a write that was applied
// on the primary but not replicated in time: code 64, WriteConcernFailed,
// errInfo {wtimeout: true}, no labels.
func WriteConcernTimeout() WriteConcernError {
	return WriteConcernError{
		Code: 64, CodeName: "WriteConcernFailed", Errmsg: "waiting for replication timed out",
		ErrInfo: bson.D{{Key: "wtimeout", Value: true}},
	}
}

func errmsg(msg, codeName string) string {
	if msg != "" {
		return msg
	}
	return "mongotest: injected " + codeName
}

func (e ServerError) reply() (bson.Raw, error) {
	d := bson.D{
		{Key: "ok", Value: 0.0},
		{Key: "errmsg", Value: errmsg(e.Errmsg, e.CodeName)},
		{Key: "code", Value: e.Code},
		{Key: "codeName", Value: e.CodeName},
	}
	if len(e.ErrorLabels) > 0 {
		d = append(d, bson.E{Key: "errorLabels", Value: e.ErrorLabels})
	}
	return bson.Marshal(d)
}

// arm arms a wireproxy fault; the faults mongotest builds are always
// complete, so an error is a bug here.
func (f *Faulty) arm(wf wireproxy.Fault) *Fault {
	t, err := f.proxy.Arm(wf)
	if err != nil {
		panic("mongotest: " + err.Error())
	}
	return &Fault{f: f, t: t}
}

// WriteConcernErrorNext arms a write-concern failure: the next request that
// matches is sent to the server and applied, and the client gets the
// server's reply with wce added as its writeConcernError (and wce's labels
// in its errorLabels): a write that happened, reported as failing its write
// concern. The driver returns it as a mongo.WriteException (a
// mongo.CommandError for findAndModify) carrying the WriteConcernError.
func (f *Faulty) WriteConcernErrorNext(match Match, wce WriteConcernError) *Fault {
	w := bson.D{
		{Key: "code", Value: wce.Code},
		{Key: "codeName", Value: wce.CodeName},
		{Key: "errmsg", Value: errmsg(wce.Errmsg, wce.CodeName)},
	}
	if wce.ErrInfo != nil {
		w = append(w, bson.E{Key: "errInfo", Value: wce.ErrInfo})
	}
	labels := slices.Clone(wce.ErrorLabels)
	return f.arm(wireproxy.Fault{Action: wireproxy.RewriteReply, Match: match, Rewrite: func(_ *Command, reply bson.Raw) (bson.Raw, error) {
		var d bson.D
		if err := bson.Unmarshal(reply, &d); err != nil {
			return nil, err
		}
		out := make(bson.D, 0, len(d)+2)
		var have bson.A
		for _, e := range d {
			switch e.Key {
			case "writeConcernError":
				continue // replaced
			case "errorLabels":
				if a, ok := e.Value.(bson.A); ok {
					have = a
				}
				continue
			}
			out = append(out, e)
		}
		out = append(out, bson.E{Key: "writeConcernError", Value: w})
		for _, l := range labels {
			if !slices.Contains(have, any(l)) {
				have = append(have, l)
			}
		}
		if len(have) > 0 {
			out = append(out, bson.E{Key: "errorLabels", Value: have})
		}
		return bson.Marshal(out)
	}})
}

// ErrorAfterApply arms an error reply for a write that happened: the next
// request that matches is sent to the server and applied, and the client
// gets e instead of the server's reply.
func (f *Faulty) ErrorAfterApply(match Match, e ServerError) *Fault {
	reply, err := e.reply()
	if err != nil {
		panic("mongotest: " + err.Error())
	}
	return f.arm(wireproxy.Fault{Action: wireproxy.RewriteReply, Match: match, Rewrite: func(*Command, bson.Raw) (bson.Raw, error) {
		return reply, nil
	}})
}

// ErrorBeforeApply arms an error reply for a write that never happened: the
// next request that matches is not sent to the server, and the client gets
// e as its reply.
func (f *Faulty) ErrorBeforeApply(match Match, e ServerError) *Fault {
	reply, err := e.reply()
	if err != nil {
		panic("mongotest: " + err.Error())
	}
	return f.arm(wireproxy.Fault{Action: wireproxy.Refuse, Match: match, Reply: reply})
}

// RewriteReplies arms a reply rewriter for the next n requests that match:
// each is sent to the server and applied, and the client gets the reply body
// rewrite returns, given the request and the server's reply body (say, a
// find's batch replaced by an older one, or hello's localTime moved). A
// rewrite that returns an error or an invalid document is a refusal (see
// Err), which fails the test at cleanup.
func (f *Faulty) RewriteReplies(n int, match Match, rewrite func(cmd *Command, reply bson.Raw) (bson.Raw, error)) *Fault {
	if n <= 0 || rewrite == nil {
		panic("mongotest: RewriteReplies needs n > 0 and a rewrite function")
	}
	return f.arm(wireproxy.Fault{Action: wireproxy.RewriteReply, Match: match, Times: n, Rewrite: rewrite})
}

// AnswerInstead arms a reply for requests that never happen: the next n
// requests that match are not sent to the server, and the client gets reply
// as the server's answer (say, {ok: 1, n: 1, nModified: 1} for an update:
// a server that acknowledges a write it never applied).
func (f *Faulty) AnswerInstead(n int, match Match, reply bson.Raw) *Fault {
	if n <= 0 {
		panic("mongotest: AnswerInstead needs n > 0")
	}
	return f.arm(wireproxy.Fault{Action: wireproxy.Refuse, Match: match, Times: n, Reply: reply})
}

// HoldNext arms a late copy: the next request that matches is kept at the
// proxy, not sent to the server, and the client's connection is closed, so
// the client gets a network error for a write the server has not seen. The
// client may then re-read and send the write again. Fault.Deliver sends the
// kept copy to the server when the test decides (on the embedded backend,
// under the serializing lock like any other exchange), so "at most one copy
// applies" is tested with two copies really reaching the server. A copy
// never delivered is discarded at cleanup.
func (f *Faulty) HoldNext(match Match) *Fault {
	return f.arm(wireproxy.Fault{Action: wireproxy.Hold, Match: match})
}

// Deliver sends the copy a HoldNext fault kept to the server, on a
// connection of its own, and returns the server's reply body (for an
// update, {n, nModified, ok}: n is 0 when the copy's filter no longer
// matched). It returns ErrNothingHeld when the fault has not fired yet or
// its copy was delivered already. A copy is sent at most once. ctx bounds
// the exchange.
func (f *Fault) Deliver(ctx context.Context) (bson.Raw, error) {
	replies, err := f.f.proxy.Deliver(ctx, f.t)
	if err != nil {
		return nil, err
	}
	return replies[0], nil
}

// Delivered returns the server's replies to the copies Deliver sent so far.
func (f *Fault) Delivered() []bson.Raw { return f.f.proxy.Delivered(f.t) }

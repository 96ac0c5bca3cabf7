package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// ErrConnect is matched (through errors.Is) by every error Connect returns
// when it cannot reach a server or cannot parse the URI.
var ErrConnect = errors.New("store: cannot connect")

// ConnectError tells which URI (credentials redacted) could not be used, and
// why. It matches ErrConnect and unwraps to the driver's error.
type ConnectError struct {
	// URI is the connection string with any password removed.
	URI string
	// Err is the underlying error.
	Err error
}

func (e *ConnectError) Error() string {
	return fmt.Sprintf("store: cannot connect to %s: %v", e.URI, e.Err)
}

// Unwrap returns ErrConnect and the underlying error.
func (e *ConnectError) Unwrap() []error { return []error{ErrConnect, e.Err} }

// Options configures Connect. A nil *Options means all defaults.
type Options struct {
	// AppName is sent to the server in the handshake and shows in its logs
	// and currentOp. Default "mongocas".
	AppName string
	// ConnectTimeout bounds establishing one connection. Default 10s.
	ConnectTimeout time.Duration
	// ServerSelectionTimeout bounds finding a suitable server for an
	// operation, and so how long Connect waits for the first ping.
	// Default 10s.
	ServerSelectionTimeout time.Duration
	// MaxPoolSize caps connections per server. Default 100.
	MaxPoolSize uint64
	// ClientOptions, when not nil, is applied after the defaults above and
	// after the URI, so it can override anything.
	ClientOptions *options.ClientOptions
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.AppName == "" {
		r.AppName = "mongocas"
	}
	if r.ConnectTimeout <= 0 {
		r.ConnectTimeout = 10 * time.Second
	}
	if r.ServerSelectionTimeout <= 0 {
		r.ServerSelectionTimeout = 10 * time.Second
	}
	if r.MaxPoolSize == 0 {
		r.MaxPoolSize = 100
	}
	return r
}

// ClientOptions returns the driver options Connect uses for uri: majority
// write concern with journaling, retryable writes and reads on, primary
// reads, the timeouts and app name of opts. Options given in the URI
// override these defaults; opts.ClientOptions overrides both.
func ClientOptions(uri string, opts *Options) *options.ClientOptions {
	o := opts.withDefaults()
	co := options.Client().
		SetAppName(o.AppName).
		SetWriteConcern(writeconcern.Majority()).
		SetRetryWrites(true).
		SetRetryReads(true).
		SetReadPreference(readpref.Primary()).
		SetConnectTimeout(o.ConnectTimeout).
		SetServerSelectionTimeout(o.ServerSelectionTimeout).
		SetMaxPoolSize(o.MaxPoolSize).
		ApplyURI(uri)
	if o.ClientOptions != nil {
		co = options.MergeClientOptions(co, o.ClientOptions)
	}
	return co
}

// Store is a connected client with what mongocas learns about its server: its
// capabilities and its clock. It is safe for concurrent use.
type Store struct {
	client *mongo.Client
	owns   bool
	clock  *Clock

	mu   sync.Mutex
	caps map[string]Capabilities
}

// Connect connects to uri with production defaults (see ClientOptions) and
// pings the primary, so a wrong or unreachable URI fails here within
// ServerSelectionTimeout (or ctx), not on the first write. The error is a
// *ConnectError naming the URI with its password redacted. The Store owns the
// client: Close disconnects it.
func Connect(ctx context.Context, uri string, opts *Options) (*Store, error) {
	if strings.TrimSpace(uri) == "" {
		return nil, &ConnectError{URI: `""`, Err: errors.New("empty URI")}
	}
	co := ClientOptions(uri, opts)
	if err := co.Validate(); err != nil {
		return nil, &ConnectError{URI: RedactURI(uri), Err: err}
	}
	client, err := mongo.Connect(co)
	if err != nil {
		return nil, &ConnectError{URI: RedactURI(uri), Err: err}
	}
	if err := client.Ping(ctx, readpref.Primary()); err != nil {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, &ConnectError{URI: RedactURI(uri), Err: err}
	}
	return &Store{client: client, owns: true, clock: NewClock(HelloSampler(client), nil), caps: map[string]Capabilities{}}, nil
}

// New wraps a client the caller already has. The Store does not own it: Close
// leaves it connected.
func New(client *mongo.Client) *Store {
	return &Store{client: client, clock: NewClock(HelloSampler(client), nil), caps: map[string]Capabilities{}}
}

// Client returns the driver client.
func (s *Store) Client() *mongo.Client { return s.client }

// Database returns a handle to the named database.
func (s *Store) Database(name string, opts ...options.Lister[options.DatabaseOptions]) *mongo.Database {
	return s.client.Database(name, opts...)
}

// Clock returns the Store's estimate of the server's clock. It takes its
// first reading on first use.
func (s *Store) Clock() *Clock { return s.clock }

// Capabilities probes what the server behind db can do (see Probe) and
// caches the answer per database name for the life of the Store.
func (s *Store) Capabilities(ctx context.Context, db *mongo.Database) (Capabilities, error) {
	s.mu.Lock()
	c, ok := s.caps[db.Name()]
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	c, err := Probe(ctx, db)
	if err != nil {
		return c, err
	}
	s.mu.Lock()
	s.caps[db.Name()] = c
	s.mu.Unlock()
	return c, nil
}

// Close disconnects the client when the Store owns it (Connect); a Store
// made by New leaves the caller's client connected.
func (s *Store) Close(ctx context.Context) error {
	if s.owns {
		return s.client.Disconnect(ctx)
	}
	return nil
}

// RedactURI returns uri with any password replaced by "xxxxx", keeping the
// scheme, user name, hosts, path and options, so that an error can name the
// URI without leaking the secret. It works on connection strings that do not
// parse as URLs too (several hosts, a bad port).
func RedactURI(uri string) string {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		scheme, rest = "", uri
	}
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		user, _, hasPassword := strings.Cut(authority[:at], ":")
		if hasPassword {
			user += ":xxxxx"
		}
		authority = user + "@" + authority[at+1:]
	}
	if scheme == "" {
		return authority + tail
	}
	return scheme + "://" + authority + tail
}

package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// ErrConnect is matched by every error Connect returns.
var ErrConnect = errors.New("store: cannot connect")

// ConnectError tells which URI could not be used, and why. It matches
// ErrConnect and unwraps to the driver's error.
type ConnectError struct {
	URI string // the connection string with its secrets redacted (RedactURI)
	Err error  // the underlying error
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
	// ClientOptions, when not nil, overrides the defaults above and the URI.
	ClientOptions *options.ClientOptions
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	r.AppName = cmp.Or(r.AppName, "mongocas")
	r.ConnectTimeout = positiveOr(r.ConnectTimeout, 10*time.Second)
	r.ServerSelectionTimeout = positiveOr(r.ServerSelectionTimeout, 10*time.Second)
	r.MaxPoolSize = cmp.Or(r.MaxPoolSize, 100)
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

// Store is a connected client. It is safe for concurrent use.
type Store struct {
	client *mongo.Client
	owns   bool
}

// Connect connects to uri with production defaults (see ClientOptions) and
// pings the primary, so a wrong or unreachable URI fails here within
// ServerSelectionTimeout (or ctx). The error is a *ConnectError. The Store
// owns the client: Close disconnects it.
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
	return &Store{client: client, owns: true}, nil
}

// New wraps a client the caller already has. The Store does not own it: Close
// leaves it connected.
func New(client *mongo.Client) *Store {
	return &Store{client: client}
}

// Client returns the driver client.
func (s *Store) Client() *mongo.Client { return s.client }

// Database returns a handle to the named database.
func (s *Store) Database(name string, opts ...options.Lister[options.DatabaseOptions]) *mongo.Database {
	return s.client.Database(name, opts...)
}

// Server returns For(s.Client()): what mongocas knows about the server.
func (s *Store) Server() *Server { return For(s.client) }

// Close disconnects the client when the Store owns it (Connect); a Store
// made by New leaves the caller's client connected.
func (s *Store) Close(ctx context.Context) error {
	if s.owns {
		return s.client.Disconnect(ctx)
	}
	return nil
}

// RedactURI returns uri with its secrets replaced by "xxxxx", keeping the
// scheme, user name, hosts, path and other options, so that an error can name
// the URI without leaking them. The secrets are the password and the values of
// options whose names contain "pass", "pwd", "secret" or "token" (in any case,
// escaped or not) and of authMechanismProperties. On a connection string the
// driver would not accept, everything from the ':' after the user name to the
// last '@' is hidden.
func RedactURI(uri string) string {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		scheme, rest = "", uri
	}
	// Both kinds are found on the original text, then hidden together.
	spans := secretOptionSpans(rest)
	if at := userInfoEnd(rest); at >= 0 {
		if colon := strings.IndexByte(rest[:at], ':'); colon >= 0 {
			spans = append(spans, [2]int{colon + 1, at})
		}
	}
	slices.SortFunc(spans, func(a, b [2]int) int { return a[0] - b[0] })
	var b strings.Builder
	if ok {
		b.WriteString(scheme + "://")
	}
	done := 0
	for i := 0; i < len(spans); {
		start, end := spans[i][0], spans[i][1]
		for i++; i < len(spans) && spans[i][0] <= end; i++ {
			end = max(end, spans[i][1])
		}
		b.WriteString(rest[done:start] + redacted)
		done = end
	}
	b.WriteString(rest[done:])
	return b.String()
}

const redacted = "xxxxx"

// userInfoEnd returns the index of the '@' that ends the user information of
// rest (a URI without its scheme), or -1 if it has none. See RedactURI.
func userInfoEnd(rest string) int {
	first := strings.IndexByte(rest, '@')
	if first < 0 {
		return -1
	}
	if driverReading(rest, first) {
		return first
	}
	return strings.LastIndexByte(rest, '@')
}

// driverReading reports whether rest, whose first '@' is at first, reads
// unambiguously the way the driver reads it: user information up to the first
// '@' with no '/', at most one ':' and no empty password if another '@'
// follows, then hosts, then a path with no '@', then options with an '@'
// only inside a value.
func driverReading(rest string, first int) bool {
	userInfo := rest[:first]
	if strings.Contains(userInfo, "/") || strings.Count(userInfo, ":") > 1 {
		return false
	}
	after := rest[first+1:]
	if strings.HasSuffix(userInfo, ":") && strings.Contains(after, "@") {
		return false // the '@' may open the password rather than end it
	}
	i := strings.IndexAny(after, "/?@")
	if i < 0 {
		return after != ""
	}
	if i == 0 || after[i] != '/' {
		return false
	}
	path, query, _ := strings.Cut(after[i:], "?")
	if strings.Contains(path, "@") {
		return false
	}
	for pair := range strings.FieldsFuncSeq(query, func(r rune) bool { return r == '&' || r == ';' }) {
		if name, _, hasValue := strings.Cut(pair, "="); strings.Contains(name, "@") || (!hasValue && strings.Contains(pair, "@")) {
			return false
		}
	}
	return true
}

// secretOptionSpans returns where the values of secret options are in s (see
// RedactURI). An option starts after any '?', '&' or ';' and its value runs
// to the next '&' or ';'.
func secretOptionSpans(s string) [][2]int {
	var spans [][2]int
	for i := range len(s) {
		if s[i] != '?' && s[i] != '&' && s[i] != ';' {
			continue
		}
		opt := s[i+1:]
		if end := strings.IndexAny(opt, "&;"); end >= 0 {
			opt = opt[:end]
		}
		if name, _, hasValue := strings.Cut(opt, "="); hasValue && secretOption(name) {
			start := i + 1 + len(name) + 1
			spans = append(spans, [2]int{start, start + len(opt) - len(name) - 1})
		}
	}
	return spans
}

// secretOption reports whether the URI option name (escaped or not) may carry
// a secret.
func secretOption(name string) bool {
	if u, err := url.QueryUnescape(name); err == nil {
		name = u
	}
	name = strings.ToLower(name)
	for _, s := range []string{"pass", "pwd", "secret", "token", "authmechanismproperties"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

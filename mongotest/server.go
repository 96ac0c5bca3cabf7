package mongotest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/mongotest/internal/wireproxy"
	"github.com/mongocas/mongocas/store"
)

// Backend names the kind of server a Server is.
type Backend string

// The backends, in the order Start tries them.
const (
	// BackendURI is the server at MONGODB_URI.
	BackendURI Backend = "uri"
	// BackendDocker is a single-node MongoDB replica set in a container,
	// started through testcontainers-go (in a child process) when a Docker
	// engine answers.
	BackendDocker Backend = "docker"
	// BackendEmbedded is FerretDB v1 (SQLite handler, temporary directory)
	// running in this process behind a proxy that serializes wire
	// exchanges. See the package documentation for what it proves.
	BackendEmbedded Backend = "embedded"
)

// Environment variables Start reads.
const (
	// EnvURI names a server to use instead of starting one.
	EnvURI = "MONGODB_URI"
	// EnvBackend forces a backend: "uri", "docker" or "embedded".
	EnvBackend = "MONGOCAS_BACKEND"
	// EnvDockerImage overrides the MongoDB image for the Docker backend
	// (see EnvMongoDBVersion).
	EnvDockerImage = "MONGOCAS_DOCKER_IMAGE"
)

// DefaultDockerImage is the image the Docker backend runs by default.
const DefaultDockerImage = "mongo:" + DefaultMongoDBVersion

// ErrNoServer is matched by every error Start returns: no backend could give
// a server.
var ErrNoServer = errors.New("mongotest: no MongoDB-wire server")

// Server is a running MongoDB-wire server shared by every test in the
// process.
type Server struct {
	// Backend tells which backend this is.
	Backend Backend
	// URI is what clients connect to. For the embedded backend it is the
	// serializing proxy, never FerretDB itself.
	URI string
	// Caps is what the server can do, as store.Probe found it.
	Caps store.Capabilities
	// Client is a client connected to URI with store's production defaults.
	// It is shared: do not disconnect it.
	Client *mongo.Client

	// Embedded says how the embedded backend runs FerretDB: "in-process" or
	// "child process" (see EnvEmbedded); empty for other backends.
	Embedded string
	// Dir is the directory holding the embedded server's data, removed by
	// Shutdown; empty for other backends.
	Dir string

	// fallback says why the embedded backend runs where Docker was looked
	// for: the line that names the backend ends with it.
	fallback string

	// Serialized is true when a proxy in front of the server runs one
	// request at a time (the embedded backend): concurrency claims tested
	// there rest on that model. On every other backend, FerretDB v2 on
	// DocumentDB included, clients reach the server directly and its own
	// engine runs concurrent writes.
	Serialized bool

	// upstream is the address fault proxies forward to, and serializer the
	// mutex they must share ("" and nil when faults cannot be injected).
	upstream   string
	serializer *sync.Mutex

	stop func()
}

var (
	startMu  sync.Mutex
	shared   *Server
	errStart error
)

// Start returns the process's shared server, starting it on first call:
// the server at MONGODB_URI when that is set; else a MongoDB replica set in
// Docker when a Docker engine answers (see EnvMongoDBVersion); else embedded
// FerretDB behind the serializing proxy, and the line that names the backend
// says why not Docker. MONGOCAS_BACKEND forces one. The
// first failure is remembered and returned to every later caller.
func Start(ctx context.Context) (*Server, error) {
	startMu.Lock()
	defer startMu.Unlock()
	if shared != nil || errStart != nil {
		return shared, errStart
	}
	began := time.Now()
	s, err := start(ctx)
	if err != nil {
		errStart = fmt.Errorf("%w: %w", ErrNoServer, err)
		return nil, errStart
	}
	shared = s
	if testing.Testing() {
		// Once per test binary, that is per package, and shown without -v
		// (see noticef).
		noticef("mongotest: %s: %s (started in %s)", binaryName(), s.describe(), time.Since(began).Round(time.Millisecond))
	}
	return s, nil
}

// String says in a line which server this is, for a program's first line
// of output. A password in the URI is never shown.
func (s *Server) String() string { return s.describe() }

// describe says in a line which server this is.
func (s *Server) describe() string {
	switch s.Backend {
	case BackendURI:
		return fmt.Sprintf("the server at %s, %s (%s)", EnvURI, store.RedactURI(s.URI), s.Caps)
	case BackendDocker:
		return fmt.Sprintf("MongoDB in Docker (%s)", s.Caps)
	case BackendEmbedded:
		d := fmt.Sprintf("the embedded server, FerretDB in a %s behind the serializing proxy (%s)", s.Embedded, s.Caps)
		if s.fallback != "" {
			d += "; not Docker: " + s.fallback
		}
		return d
	}
	return string(s.Backend)
}

// Shutdown stops the shared server, if one was started, and removes what
// it left on disk. Tests normally let Main call it.
func Shutdown() {
	shutdownAlt()
	startMu.Lock()
	defer startMu.Unlock()
	if shared != nil {
		shared.stop()
		shared = nil
	}
	errStart = nil
}

func start(ctx context.Context) (*Server, error) {
	s, err := pick(ctx)
	if err != nil {
		return nil, &startError{err: err, fix: fixFor(err)}
	}
	return s, nil
}

// startError is a start-up failure with what to do about it.
type startError struct {
	err error
	fix string
}

func (e *startError) Error() string { return e.err.Error() + ". To fix: " + e.fix }
func (e *startError) Unwrap() error { return e.err }

// Start-up failures of each backend, so that fixFor can suggest a fix.
var (
	errURIBackend      = errors.New("uri backend")
	errDockerBackend   = errors.New("docker backend")
	errEmbeddedBackend = errors.New("embedded backend")
	errBadSetting      = errors.New("bad setting")
)

// backendError tags err with its backend (one of the errors above) without
// adding to its message.
type backendError struct {
	kind error
	err  error
}

func (e *backendError) Error() string   { return e.err.Error() }
func (e *backendError) Unwrap() []error { return []error{e.kind, e.err} }

func tag(kind, err error) error {
	if err == nil {
		return nil
	}
	return &backendError{kind: kind, err: err}
}

// fixFor says what to do about a start-up failure.
func fixFor(err error) string {
	switch {
	case errors.Is(err, errBadSetting):
		return fmt.Sprintf("set %s to uri, docker or embedded, or unset it to pick one by itself; unset %s; "+
			"set %s to a MongoDB version such as 7.0, or unset it", EnvBackend, EnvEmbedded, EnvMongoDBVersion)
	case errors.Is(err, errURIBackend):
		return fmt.Sprintf("check that the server in %s is running and reachable from here (and its credentials), "+
			"or unset %s (and %s) to use Docker or the embedded server", EnvURI, EnvURI, EnvBackend)
	case errors.Is(err, errDockerBackend):
		return fmt.Sprintf("start Docker (or point DOCKER_HOST at a running engine), "+
			"or unset %s to use the embedded server (set it to embedded where an engine answers but cannot run MongoDB), "+
			"or set %s to a MongoDB of yours", EnvBackend, EnvURI)
	default:
		return fmt.Sprintf("check that the go command is on PATH and can build %s (from mongotest's sources, or "+
			"go install %s@<mongotest's version>, which needs the module proxy once), "+
			"or set %s to a MongoDB of yours", serverPackage, serverModule, EnvURI)
	}
}

// pick starts the backend the environment asks for (see Start).
func pick(ctx context.Context) (*Server, error) {
	uri := os.Getenv(EnvURI)
	switch b := Backend(strings.ToLower(os.Getenv(EnvBackend))); b {
	case BackendURI:
		if uri == "" {
			return nil, tag(errBadSetting, fmt.Errorf("%s=%s but %s is empty", EnvBackend, b, EnvURI))
		}
		return startURI(ctx, uri)
	case BackendDocker:
		p, why, ok := findDocker(ctx)
		if !ok {
			return nil, tag(errDockerBackend, fmt.Errorf("%s=docker, but no Docker engine answered: %s", EnvBackend, why))
		}
		return startDocker(ctx, p)
	case BackendEmbedded:
		return startEmbedded(ctx)
	case "":
	default:
		return nil, tag(errBadSetting, fmt.Errorf("%s=%q: want uri, docker or embedded", EnvBackend, b))
	}
	if uri != "" {
		return startURI(ctx, uri)
	}
	p, why, ok := findDocker(ctx)
	if ok {
		s, err := startDocker(ctx, p)
		var nd *noDockerError
		if !errors.As(err, &nd) {
			return s, err
		}
		why = nd.Error()
		if !strings.Contains(nd.reason, p.where) {
			why = p.where + ": " + why
		}
	}
	s, err := startEmbedded(ctx)
	if s != nil {
		s.fallback = why
	}
	return s, err
}

func connect(ctx context.Context, uri string, b Backend) (*Server, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := store.Connect(ctx, uri, &store.Options{AppName: "mongocas-test", ServerSelectionTimeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	client := st.Client()
	caps, err := store.Probe(ctx, client.Database("mongocas_probe_db"))
	if err != nil {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("probe %s: %w", store.RedactURI(uri), err)
	}
	_ = client.Database("mongocas_probe_db").Drop(ctx)
	return &Server{Backend: b, URI: uri, Caps: caps, Client: client}, nil
}

func startURI(ctx context.Context, uri string) (*Server, error) {
	s, err := connect(ctx, uri, BackendURI)
	if err != nil {
		return nil, tag(errURIBackend, err)
	}
	s.upstream = faultUpstream(ctx, s.Client, uri)
	s.stop = func() { _ = s.Client.Disconnect(context.Background()) }
	return s, nil
}

// faultUpstream returns the address of the primary when traffic to it can
// go through a plain TCP proxy, or "" (TLS, SRV).
func faultUpstream(ctx context.Context, client *mongo.Client, uri string) string {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "mongodb" {
		return ""
	}
	q := u.Query()
	if q.Get("tls") == "true" || q.Get("ssl") == "true" {
		return ""
	}
	var hello struct {
		Primary string `bson:"primary"`
		Me      string `bson:"me"`
	}
	_ = client.Database("admin").RunCommand(ctx, map[string]int{"hello": 1}).Decode(&hello)
	if hello.Primary != "" {
		d := net.Dialer{Timeout: time.Second}
		if c, err := d.DialContext(ctx, "tcp", hello.Primary); err == nil {
			_ = c.Close()
			return hello.Primary
		}
	}
	if hosts := strings.Split(u.Host, ","); len(hosts) == 1 {
		if !strings.Contains(hosts[0], ":") {
			return hosts[0] + ":27017"
		}
		return hosts[0]
	}
	return ""
}

func startDocker(ctx context.Context, p dockerPlace) (*Server, error) {
	s, err := runDocker(ctx, p)
	return s, tag(errDockerBackend, err)
}

// tempRoot prefers a memory file system for the embedded server's files.
func tempRoot() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if f, err := os.CreateTemp("/dev/shm", "mongocas-probe-"); err == nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
			return "/dev/shm"
		}
	}
	return ""
}

func startEmbedded(ctx context.Context) (*Server, error) {
	s, err := runEmbedded(ctx)
	return s, tag(errEmbeddedBackend, err)
}

func runEmbedded(ctx context.Context) (s *Server, err error) {
	dir, err := os.MkdirTemp(tempRoot(), "mongocas-ferretdb-")
	if err != nil {
		return nil, fmt.Errorf("embedded backend: temp dir: %w", err)
	}
	var cleanups []func()
	cleanup := func() {
		for _, c := range slices.Backward(cleanups) {
			c()
		}
		_ = os.RemoveAll(dir)
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()

	ferretAddr, stopFerret, how, err := launchFerretDB(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("embedded backend: %w", err)
	}
	cleanups = append(cleanups, stopFerret)
	serializer := &sync.Mutex{}
	p, err := wireproxy.New(wireproxy.Config{Upstream: ferretAddr, Serializer: serializer})
	if err != nil {
		return nil, fmt.Errorf("embedded backend: %w", err)
	}
	cleanups = append(cleanups, func() { _ = p.Close() })

	uri := "mongodb://" + p.Addr() + "/"
	srv, err := connect(ctx, uri, BackendEmbedded)
	if err != nil {
		return nil, fmt.Errorf("embedded backend: %w", err)
	}
	cleanups = append(cleanups, func() { _ = srv.Client.Disconnect(context.Background()) })
	srv.upstream, srv.serializer = ferretAddr, serializer
	srv.Embedded = how
	srv.Dir = dir
	srv.Serialized = true
	srv.stop = cleanup
	return srv, nil
}

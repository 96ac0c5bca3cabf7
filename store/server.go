package store

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Server is what mongocas knows about the server behind one client: what it
// is (hello and buildInfo), what it can do (Probe), and an estimate of its
// clock, shared by everything made on the client. Each fact is found once,
// by the first call that needs it (concurrent callers wait, each with its
// own context); a failed attempt is not kept. A Server is safe for
// concurrent use.
type Server struct {
	client weak.Pointer[mongo.Client] // the client is never kept alive by its Server
	clock  *ServerClock
	ident  lazy[Capabilities] // hello and buildInfo only
	caps   lazy[Capabilities] // all of Probe
}

// errNoClient is the error of a Server whose client was garbage-collected.
var errNoClient = errors.New("store: the client is gone")

var servers sync.Map // weak.Pointer[mongo.Client] to *Server

// For returns the Server of client, made on first use. It does no I/O. A
// client's Server lives as long as the client.
func For(client *mongo.Client) *Server {
	k := weak.Make(client)
	if s, ok := servers.Load(k); ok {
		return s.(*Server) //nolint:forcetypeassert // servers holds only *Server
	}
	s := &Server{client: k, ident: newLazy[Capabilities](), caps: newLazy[Capabilities](), clock: NewServerClock(func(ctx context.Context) (time.Time, error) {
		if c := k.Value(); c != nil {
			return HelloSampler(c)(ctx)
		}
		return time.Time{}, errNoClient
	}, nil)}
	v, loaded := servers.LoadOrStore(k, s)
	if !loaded {
		runtime.AddCleanup(client, func(k weak.Pointer[mongo.Client]) { servers.Delete(k) }, k)
	}
	return v.(*Server) //nolint:forcetypeassert // servers holds only *Server
}

// Clock returns the estimate of the server's clock shared by everything made
// on the client. It takes its first reading on first use.
func (s *Server) Clock() *ServerClock { return s.clock }

// Kind returns the kind of server, from buildInfo (with hello), asked once
// per client and shared with Capabilities.
func (s *Server) Kind(ctx context.Context) (ServerKind, error) {
	c, err := s.identity(ctx)
	return c.Server, err
}

// identity returns what hello and buildInfo tell, asked once per client.
func (s *Server) identity(ctx context.Context) (Capabilities, error) {
	return s.ident.get(ctx, func(ctx context.Context) (Capabilities, error) {
		if client := s.client.Value(); client != nil {
			return identify(ctx, client)
		}
		return Capabilities{}, errNoClient
	})
}

// Capabilities returns what the server can do (see Probe), probed once per
// client, on scratch documents of db (a database of the client that the
// caller may write to; the first caller's is used).
func (s *Server) Capabilities(ctx context.Context, db *mongo.Database) (Capabilities, error) {
	return s.caps.get(ctx, func(ctx context.Context) (Capabilities, error) {
		c, err := s.identity(ctx)
		if err != nil {
			return c, err
		}
		return try(ctx, db, c)
	})
}

// lazy is a value found by the first call of get that succeeds. Callers take
// turns, each waiting with its own context.
type lazy[T any] struct {
	val  atomic.Pointer[T]
	turn chan struct{} // a 1-slot semaphore, held by the caller finding it
}

func newLazy[T any]() lazy[T] { return lazy[T]{turn: make(chan struct{}, 1)} }

// get returns the value, finding it with find (on ctx without its session:
// a probe never runs inside the caller's transaction) unless it is known.
func (l *lazy[T]) get(ctx context.Context, find func(context.Context) (T, error)) (T, error) {
	if v := l.val.Load(); v != nil {
		return *v, nil
	}
	var zero T
	if err := CheckContext(ctx); err != nil {
		return zero, err
	}
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return zero, ContextError(ctx)
	}
	defer func() { <-l.turn }()
	if v := l.val.Load(); v != nil {
		return *v, nil
	}
	v, err := find(NoSession(ctx))
	if err == nil {
		l.val.Store(&v)
	}
	return v, err
}

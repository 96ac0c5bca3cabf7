package store

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
	"weak"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Server is what mongocas knows about the server behind one client: what it
// is (hello and buildInfo), what it can do (Probe), and an estimate of its
// clock. For returns the one Server of a client, so that every repository,
// lease manager, queue and key set made on the client shares one probe and
// one ServerClock. Each fact is found lazily, by the first call that needs
// it, with that call's context, and once: concurrent callers wait for the
// same attempt (each with its own context). A failed attempt is not kept:
// the next call tries again. A Server is safe for concurrent use.
type Server struct {
	client weak.Pointer[mongo.Client] // the client is never kept alive by its Server
	clock  *ServerClock
	ident  lazy[Capabilities] // hello and buildInfo only
	caps   lazy[Capabilities] // all of Probe
}

// errNoClient is the error of a Server whose client was garbage-collected
// (no caller holds it any more).
var errNoClient = errors.New("store: the client is gone")

var servers struct {
	mu sync.Mutex
	m  map[weak.Pointer[mongo.Client]]*Server
}

// For returns the Server of client, made on first use. It does no I/O. A
// client's Server lives as long as the client.
func For(client *mongo.Client) *Server {
	k := weak.Make(client)
	servers.mu.Lock()
	defer servers.mu.Unlock()
	if s := servers.m[k]; s != nil {
		return s
	}
	if servers.m == nil {
		servers.m = map[weak.Pointer[mongo.Client]]*Server{}
	}
	s := &Server{client: k}
	s.clock = NewServerClock(func(ctx context.Context) (time.Time, error) {
		c := k.Value()
		if c == nil {
			return time.Time{}, errNoClient
		}
		return HelloSampler(c)(ctx)
	}, nil)
	servers.m[k] = s
	runtime.AddCleanup(client, func(k weak.Pointer[mongo.Client]) {
		servers.mu.Lock()
		delete(servers.m, k)
		servers.mu.Unlock()
	}, k)
	return s
}

// Clock returns the estimate of the server's clock shared by everything made
// on the client. It takes its first reading on first use.
func (s *Server) Clock() *ServerClock { return s.clock }

// Kind returns the kind of server, from buildInfo (with hello), asked once
// per client and shared with Capabilities.
func (s *Server) Kind(ctx context.Context) (ServerKind, error) {
	c, err := s.ident.get(ctx, func(ctx context.Context) (Capabilities, error) {
		client := s.client.Value()
		if client == nil {
			return Capabilities{}, errNoClient
		}
		return identify(ctx, client)
	})
	return c.Server, err
}

// Capabilities returns what the server can do (see Probe), probed once per
// client, on scratch documents of db (a database of the client that the
// caller may write to; the first caller's is used).
func (s *Server) Capabilities(ctx context.Context, db *mongo.Database) (Capabilities, error) {
	return s.caps.get(ctx, func(ctx context.Context) (Capabilities, error) {
		c, err := s.ident.get(ctx, func(ctx context.Context) (Capabilities, error) {
			return identify(ctx, db.Client())
		})
		if err != nil {
			return c, err
		}
		return try(ctx, db, c)
	})
}

// lazy is a value found once by the first caller of get, which the callers
// that come meanwhile wait for. A failure is not kept.
type lazy[T any] struct {
	mu       sync.Mutex
	val      T
	have     bool
	inflight *attempt[T]
}

type attempt[T any] struct {
	done     chan struct{}
	val      T
	err      error
	ctxEnded bool // it failed because its caller's context ended
}

// get returns the value, finding it with find (on ctx, without its session:
// a probe never runs inside the caller's transaction) unless it is known or
// being found. A caller that waits ends with its own context; if the attempt
// it waited for failed with its caller's context, it makes its own.
func (l *lazy[T]) get(ctx context.Context, find func(context.Context) (T, error)) (T, error) {
	var zero T
	if err := CheckContext(ctx); err != nil {
		return zero, err
	}
	for {
		l.mu.Lock()
		if l.have {
			v := l.val
			l.mu.Unlock()
			return v, nil
		}
		if a := l.inflight; a != nil {
			l.mu.Unlock()
			select {
			case <-a.done:
			case <-ctx.Done():
				return zero, ContextError(ctx)
			}
			if a.err != nil && a.ctxEnded && ctx.Err() == nil {
				continue
			}
			return a.val, a.err
		}
		a := &attempt[T]{done: make(chan struct{})}
		l.inflight = a
		l.mu.Unlock()

		if mongo.SessionFromContext(ctx) != nil {
			ctx = mongo.NewSessionContext(ctx, nil)
		}
		a.val, a.err = find(ctx)
		// The driver may give up at the context's deadline a moment before
		// the context says it ended.
		deadline, has := ctx.Deadline()
		a.ctxEnded = a.err != nil && (ctx.Err() != nil || has && !time.Now().Before(deadline))
		l.mu.Lock()
		if a.err == nil {
			l.val, l.have = a.val, true
		}
		l.inflight = nil
		l.mu.Unlock()
		close(a.done)
		return a.val, a.err
	}
}

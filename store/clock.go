package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/mongocas/mongocas/observe"
)

// ErrNoServerTime is matched by every error a ServerClock returns when it has
// no usable reading of the server's clock and cannot take one (the error
// then also matches the context's error if that ended).
var ErrNoServerTime = errors.New("store: no reading of the server clock")

// Sampler reads the server's current time once; the ServerClock times the
// call. The zero time with a nil error counts as a failed reading.
type Sampler func(ctx context.Context) (time.Time, error)

// HelloSampler reads the server's clock from the localTime field of the
// hello command's reply, sent to the primary outside any session or
// transaction that ctx carries. hello needs no privileges.
func HelloSampler(client *mongo.Client) Sampler {
	admin := client.Database("admin")
	primary := options.RunCmd().SetReadPreference(readpref.Primary())
	return func(ctx context.Context) (time.Time, error) {
		var reply struct {
			LocalTime bson.DateTime `bson:"localTime"`
		}
		ctx = NoSession(ctx) // see DESIGN.md, "Which server"
		if err := admin.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}, primary).Decode(&reply); err != nil {
			return time.Time{}, fmt.Errorf("%w: hello: %w", ErrNoServerTime, err)
		}
		if reply.LocalTime == 0 {
			return time.Time{}, fmt.Errorf("%w: hello reply has no localTime", ErrNoServerTime)
		}
		return reply.LocalTime.Time(), nil
	}
}

// ServerClockOptions configures a ServerClock. A nil *ServerClockOptions means all defaults.
type ServerClockOptions struct {
	// Samples is the most readings one sync takes (it stops at the first
	// failed one); the one with the smallest round trip is kept. Default 3.
	Samples int
	// ResyncInterval is the age after which a reading is stale: the next call
	// to Now takes new readings, and any new reading replaces it. Default 30s.
	ResyncInterval time.Duration
	// MaxAge is the age after which a reading is no longer used at all: Now
	// then fails unless a new reading can be taken. Raised to ResyncInterval
	// if smaller. Default 5m.
	MaxAge time.Duration
	// DriftRate is the assumed worst-case rate at which the local and server
	// clocks drift apart, added to the bound for every second since the
	// reading. Default 1e-4 (100 µs per second).
	DriftRate float64
	// Now is the local clock; only differences between its readings are
	// used. Default time.Now. Tests inject a fake here.
	Now func() time.Time
	// Observer, if not nil, receives an observe.ClockSync event after each
	// sync that took a reading.
	Observer observe.Observer
}

func (o *ServerClockOptions) withDefaults() ServerClockOptions {
	var r ServerClockOptions
	if o != nil {
		r = *o
	}
	r.Samples = positiveOr(r.Samples, 3)
	r.ResyncInterval = positiveOr(r.ResyncInterval, 30*time.Second)
	r.MaxAge = max(positiveOr(r.MaxAge, 5*time.Minute), r.ResyncInterval)
	r.DriftRate = positiveOr(r.DriftRate, 1e-4)
	if r.Now == nil {
		r.Now = time.Now
	}
	return r
}

// positiveOr returns v if it is above zero, else def: an option's default.
func positiveOr[T int | float64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// Estimate is the server's current time as a ServerClock knows it. An Estimate
// that a ServerClock returns with a nil error is never the zero value.
type Estimate struct {
	// Time is the best estimate of the server's clock now: the reading plus
	// half its round trip (and of localTime's 1 ms resolution) plus the
	// local time elapsed since.
	Time time.Time
	// Bound is the most the server's clock can differ from Time: (round
	// trip + 1 ms) / 2, plus DriftRate for every second since the reading.
	Bound time.Duration
	// RTT is the round trip of the reading the estimate comes from.
	RTT time.Duration
	// Age is how long ago that reading was taken; always below MaxAge.
	Age time.Duration
}

// Earliest returns the earliest the server's clock can read now.
func (e Estimate) Earliest() time.Time { return e.Time.Add(-e.Bound) }

// Latest returns the latest the server's clock can read now.
func (e Estimate) Latest() time.Time { return e.Time.Add(e.Bound) }

type reading struct {
	sent, recv time.Time // local clock
	server     time.Time // server clock, millisecond resolution
}

func (r reading) rtt() time.Duration { return r.recv.Sub(r.sent) }

// ServerClock estimates the database server's current time from readings of
// its clock (hello's localTime) and the local clock's elapsed time since (see
// Estimate for the bound). It keeps one reading, replaced when it is stale
// (older than ResyncInterval) or when a new one's bound is smaller now. Now
// re-reads lazily, when the kept reading is stale; it runs no goroutine.
// Concurrent callers share one sync, so at most Samples × (1 + ⌊T /
// ResyncInterval⌋) readings are sent in a span T in which every reading
// succeeds (see DESIGN.md). A ServerClock is safe for concurrent use.
type ServerClock struct {
	sample Sampler
	opts   ServerClockOptions

	mu       sync.Mutex
	best     reading
	have     bool
	inflight *syncCall // the sync Now is running, nil if none
}

// syncCall is a sync run by one caller of Now and awaited by the others.
type syncCall struct {
	done     chan struct{} // closed when the sync ends
	err      error         // why it took no reading; set before done is closed
	ctxEnded bool          // it failed because its caller's context ended
}

// NewServerClock returns a ServerClock that reads the server's time with sample.
func NewServerClock(sample Sampler, opts *ServerClockOptions) *ServerClock {
	return &ServerClock{sample: sample, opts: opts.withDefaults()}
}

// Sync takes up to Samples readings now, stopping at the first that fails,
// and keeps the best reading (see ServerClock). It returns an error matching
// ErrNoServerTime only when no reading succeeded.
func (c *ServerClock) Sync(ctx context.Context) error {
	if err := CheckContext(ctx); err != nil {
		if ctx == nil {
			return err
		}
		return fmt.Errorf("%w: %w", ErrNoServerTime, err)
	}
	for i := range c.opts.Samples {
		sent := c.opts.Now()
		st, err := c.sample(ctx)
		recv := c.opts.Now()
		if err == nil && st.IsZero() {
			err = errors.New("the sampler returned the zero time")
		}
		if err != nil {
			if i > 0 {
				break // the readings taken are kept
			}
			return noServerTime(ctx, err)
		}
		c.offer(reading{sent: sent, recv: recv, server: st})
	}
	if o := c.opts.Observer; o != nil {
		c.mu.Lock()
		e := c.estimate(c.best, c.opts.Now())
		c.mu.Unlock()
		o.Observe(ctx, observe.Event{Kind: observe.ClockSync, Bound: e.Bound, RTT: e.RTT})
	}
	return nil
}

// noServerTime wraps err to match ErrNoServerTime and any ended ctx's error.
func noServerTime(ctx context.Context, err error) error {
	if !errors.Is(err, ErrNoServerTime) {
		err = fmt.Errorf("%w: %w", ErrNoServerTime, err)
	}
	if cerr := ContextError(ctx); cerr != nil && !errors.Is(err, ctx.Err()) {
		err = fmt.Errorf("%w: %w", err, cerr)
	}
	return err
}

func (c *ServerClock) offer(r reading) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now()
	if !c.have || c.stale(c.best, now) || c.bound(r, now) <= c.bound(c.best, now) {
		c.best, c.have = r, true
	}
}

func (c *ServerClock) stale(r reading, now time.Time) bool {
	return now.Sub(r.recv) >= c.opts.ResyncInterval
}

// usable reports whether the kept reading may be used now; c.mu is held.
func (c *ServerClock) usable(now time.Time) bool {
	return c.have && now.Sub(c.best.recv) < c.opts.MaxAge
}

func (c *ServerClock) bound(r reading, now time.Time) time.Duration {
	age := max(now.Sub(r.recv), 0)
	return (r.rtt()+time.Millisecond)/2 + time.Duration(float64(age)*c.opts.DriftRate)
}

func (c *ServerClock) estimate(r reading, now time.Time) Estimate {
	age := now.Sub(r.recv)
	return Estimate{Time: r.server.Add((r.rtt()+time.Millisecond)/2 + age), Bound: c.bound(r, now), RTT: r.rtt(), Age: age}
}

// Now returns the estimate of the server's current time, from a reading
// younger than MaxAge, or an error matching ErrNoServerTime; never the zero
// Estimate with a nil error. It answers from the kept reading while that is
// fresh, else syncs (see Sync) or, while another caller syncs, waits for
// that sync; a kept reading younger than MaxAge answers when a sync fails or
// runs elsewhere. A nil ctx is an error matching ErrInvalid.
func (c *ServerClock) Now(ctx context.Context) (Estimate, error) {
	if ctx == nil {
		return Estimate{}, CheckContext(ctx)
	}
	for {
		c.mu.Lock()
		now := c.opts.Now()
		s := c.inflight
		if c.have && !c.stale(c.best, now) || s != nil && c.usable(now) {
			e := c.estimate(c.best, now)
			c.mu.Unlock()
			return e, nil
		}
		if s != nil {
			c.mu.Unlock()
			select {
			case <-s.done:
			case <-ctx.Done():
				return Estimate{}, noServerTime(ctx, ctx.Err())
			}
			e, err := c.settle(s.err)
			if err != nil && s.ctxEnded && ctx.Err() == nil {
				continue // that sync ended with its caller's context: try our own
			}
			return e, err
		}
		s = &syncCall{done: make(chan struct{})}
		c.inflight = s
		c.mu.Unlock()

		err := c.Sync(ctx)

		c.mu.Lock()
		s.err, s.ctxEnded = err, err != nil && ctx.Err() != nil
		c.inflight = nil
		close(s.done)
		c.mu.Unlock()
		return c.settle(err)
	}
}

// settle answers from the kept reading if it is usable now, else fails with
// err, the error of the sync that just ended.
func (c *ServerClock) settle(err error) (Estimate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now()
	switch {
	case c.usable(now):
		return c.estimate(c.best, now), nil
	case err != nil:
		return Estimate{}, err
	case !c.have:
		return Estimate{}, fmt.Errorf("%w: no reading", ErrNoServerTime)
	}
	return Estimate{}, fmt.Errorf("%w: the newest reading is %v old, past MaxAge %v", ErrNoServerTime, now.Sub(c.best.recv), c.opts.MaxAge)
}

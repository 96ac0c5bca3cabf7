package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// ErrNoServerTime is matched by the error a Clock returns when it has no
// reading of the server's clock and cannot take one (the server is
// unreachable, or its hello reply carries no localTime).
var ErrNoServerTime = errors.New("store: no reading of the server clock")

// Sampler reads the server's current time once. The Clock times the call
// itself, so a Sampler does only the round trip.
type Sampler func(ctx context.Context) (time.Time, error)

// HelloSampler reads the server's clock from the localTime field of the
// hello command's reply. hello needs no privileges and is answered by every
// MongoDB-compatible server.
func HelloSampler(client *mongo.Client) Sampler {
	admin := client.Database("admin")
	return func(ctx context.Context) (time.Time, error) {
		var reply struct {
			LocalTime bson.DateTime `bson:"localTime"`
		}
		if err := admin.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&reply); err != nil {
			return time.Time{}, fmt.Errorf("%w: hello: %w", ErrNoServerTime, err)
		}
		if reply.LocalTime == 0 {
			return time.Time{}, fmt.Errorf("%w: hello reply has no localTime", ErrNoServerTime)
		}
		return reply.LocalTime.Time(), nil
	}
}

// ClockOptions configures a Clock. A nil *ClockOptions means all defaults.
type ClockOptions struct {
	// Samples is how many readings one sync takes; the one with the smallest
	// round trip is kept. Default 3.
	Samples int
	// ResyncInterval is the age after which the kept reading is refreshed by
	// the next call to Now. Default 30s.
	ResyncInterval time.Duration
	// MaxAge is the age after which a reading is no longer used at all: Now
	// then fails unless a fresh reading can be taken. Default 5m.
	MaxAge time.Duration
	// DriftRate is the assumed worst-case rate at which the local and server
	// clocks drift apart, added to the error bound for every second since the
	// reading (1e-4 is 100 µs per second, far above what NTP-disciplined
	// clocks drift). Default 1e-4.
	DriftRate float64
	// Now is the local clock. Only differences between its readings are
	// used, never its absolute value, so a host whose wall clock is set wrong
	// gets the same estimate. Default time.Now (whose differences use the
	// monotonic clock). Tests inject a fake here.
	Now func() time.Time
}

func (o *ClockOptions) withDefaults() ClockOptions {
	var r ClockOptions
	if o != nil {
		r = *o
	}
	if r.Samples <= 0 {
		r.Samples = 3
	}
	if r.ResyncInterval <= 0 {
		r.ResyncInterval = 30 * time.Second
	}
	if r.MaxAge <= 0 {
		r.MaxAge = 5 * time.Minute
	}
	if r.MaxAge < r.ResyncInterval {
		r.MaxAge = r.ResyncInterval
	}
	if r.DriftRate <= 0 {
		r.DriftRate = 1e-4
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	return r
}

// Estimate is the server's current time as a Clock knows it.
type Estimate struct {
	// Time is the best estimate of the server's clock now.
	Time time.Time
	// Bound is the most the server's clock can differ from Time: half the
	// round trip of the reading plus the 1 ms resolution of localTime, plus
	// DriftRate for every second since the reading.
	Bound time.Duration
	// RTT is the round trip of the reading the estimate comes from.
	RTT time.Duration
	// Age is how long ago that reading was taken.
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

// Clock estimates the database server's current time from readings of its
// clock (hello's localTime) and the local clock's elapsed time since.
//
// The estimate for a reading taken between local times sent and recv is
// server + (rtt + 1ms)/2 + (now - recv), with an error bound of (rtt + 1ms)/2
// + DriftRate × (now - recv). Of several readings the Clock keeps the one whose
// bound is smallest now. It re-reads lazily, inside Now, when its reading is
// older than ResyncInterval; it runs no goroutine. A Clock is safe for
// concurrent use.
type Clock struct {
	sample Sampler
	opts   ClockOptions

	mu      sync.Mutex
	best    reading
	have    bool
	syncing chan struct{} // closed when the sync in progress ends
}

// NewClock returns a Clock that reads the server's time with sample.
func NewClock(sample Sampler, opts *ClockOptions) *Clock {
	return &Clock{sample: sample, opts: opts.withDefaults()}
}

// Sync takes Samples readings now and keeps the best reading it has. It
// returns an error only when no reading at all succeeded.
func (c *Clock) Sync(ctx context.Context) error {
	var firstErr error
	ok := false
	for range c.opts.Samples {
		sent := c.opts.Now()
		st, err := c.sample(ctx)
		recv := c.opts.Now()
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		ok = true
		c.offer(reading{sent: sent, recv: recv, server: st})
	}
	if !ok {
		if firstErr == nil {
			firstErr = ctx.Err()
		}
		if !errors.Is(firstErr, ErrNoServerTime) {
			firstErr = fmt.Errorf("%w: %w", ErrNoServerTime, firstErr)
		}
		return firstErr
	}
	return nil
}

func (c *Clock) offer(r reading) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now()
	if !c.have || c.bound(r, now) <= c.bound(c.best, now) {
		c.best, c.have = r, true
	}
}

func (c *Clock) bound(r reading, now time.Time) time.Duration {
	age := max(now.Sub(r.recv), 0)
	return (r.rtt()+time.Millisecond)/2 + time.Duration(float64(age)*c.opts.DriftRate)
}

func (c *Clock) estimate(r reading, now time.Time) Estimate {
	half := (r.rtt() + time.Millisecond) / 2
	age := now.Sub(r.recv)
	return Estimate{
		Time:  r.server.Add(half + age),
		Bound: c.bound(r, now),
		RTT:   r.rtt(),
		Age:   age,
	}
}

// Now returns the estimate of the server's current time. It takes readings
// first when it has none, or when its reading is older than ResyncInterval;
// if that refresh fails but a reading younger than MaxAge remains, it answers
// from that reading (with its wider bound). It fails with an error matching
// ErrNoServerTime only when it has no usable reading.
func (c *Clock) Now(ctx context.Context) (Estimate, error) {
	for {
		c.mu.Lock()
		now := c.opts.Now()
		age := now.Sub(c.best.recv)
		if c.have && age < c.opts.ResyncInterval {
			e := c.estimate(c.best, now)
			c.mu.Unlock()
			return e, nil
		}
		if c.syncing != nil {
			// Another caller is refreshing. Use the old reading while it is
			// still allowed, else wait for the refresh.
			if c.have && age < c.opts.MaxAge {
				e := c.estimate(c.best, now)
				c.mu.Unlock()
				return e, nil
			}
			wait := c.syncing
			c.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return Estimate{}, fmt.Errorf("%w: %w", ErrNoServerTime, ctx.Err())
			}
		}
		done := make(chan struct{})
		c.syncing = done
		c.mu.Unlock()

		err := c.Sync(ctx)

		c.mu.Lock()
		c.syncing = nil
		close(done)
		now = c.opts.Now()
		usable := c.have && now.Sub(c.best.recv) < c.opts.MaxAge
		var e Estimate
		if usable {
			e = c.estimate(c.best, now)
		}
		c.mu.Unlock()
		if usable {
			return e, nil
		}
		return Estimate{}, err
	}
}

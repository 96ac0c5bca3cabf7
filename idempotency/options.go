package idempotency

import (
	"time"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// Defaults of the Options fields.
const (
	// DefaultTTL is the TTL of a key's claim while its request runs.
	DefaultTTL = lease.DefaultTTL
	// DefaultRetention is how long a key's record is kept (Stripe's choice).
	DefaultRetention = 24 * time.Hour
)

// Options configures Keys. A nil *Options means all defaults; every zero
// field takes its default.
type Options struct {
	// TTL is how long a claim on a key lasts without a renewal, on the
	// server's clock: the longest a request that died keeps the key "in
	// progress" (409). The running request renews its claim every TTL/3,
	// so the function may run longer. Default 30s.
	TTL time.Duration

	// Retention is how long a key's record is kept after the last write of
	// its request (claim renewals included), on the server's clock: a retry
	// within Retention is replayed or resumed, a request after it runs as
	// new. It must be longer than TTL. Default 24h.
	Retention time.Duration

	// Owner identifies these Keys in claims, unique among the processes that
	// share the collection. Default: a fresh "host/pid/random" string.
	Owner string

	// Mode says how a claim's expiry is judged (see lease.Mode). Default
	// ModeAuto: $$NOW where the server has it, else the Clock's estimate.
	Mode lease.Mode

	// Clock estimates the server's clock, for the records' retention times
	// and the claims made with a new record or in lease.ModeEstimated.
	// Default: the client's shared one (store.For(client).Clock()).
	Clock *store.ServerClock

	// ResolveTimeout bounds the re-reads that settle a lost reply, and the
	// storing of a result after the function returned, which outlive the
	// caller's context. Default min(max(TTL, 1s), 10s).
	ResolveTimeout time.Duration

	// Retry tunes the renewals of a running request's claim. A request that
	// finds its key in progress gets ErrInProgress at once, never waits.
	Retry retry.Policy

	// Observer, if not nil, receives the events of these Keys (see the
	// package documentation), of the lease Manager of their claims, and of
	// the Retry policy of the renewals unless it has an Observer of its own.
	Observer observe.Observer
}

// config is Options with the defaults applied.
type config struct {
	ttl, retention, resolve time.Duration
	observer                observe.Observer
}

func (o *Options) config() (config, *lease.Options, error) {
	var opts Options
	if o != nil {
		opts = *o
	}
	c := config{ttl: opts.TTL, retention: opts.Retention, resolve: opts.ResolveTimeout, observer: opts.Observer}
	for _, d := range []struct {
		field string
		v     *time.Duration
		def   time.Duration
	}{{"TTL", &c.ttl, DefaultTTL}, {"Retention", &c.retention, DefaultRetention}, {"ResolveTimeout", &c.resolve, 0}} {
		switch {
		case *d.v < 0:
			return config{}, nil, &OptionsError{Field: d.field, Reason: "is negative"}
		case *d.v == 0:
			*d.v = d.def
		}
	}
	if c.retention <= c.ttl {
		return config{}, nil, &OptionsError{Field: "Retention", Reason: "must be longer than TTL: a record must outlive the claims on it"}
	}
	if c.resolve == 0 {
		c.resolve = min(max(c.ttl, time.Second), 10*time.Second)
	}
	p := opts.Retry
	if err := p.Validate(); err != nil {
		return config{}, nil, &OptionsError{Field: "Retry", Reason: err.Error()}
	}
	p.MaxAttempts = 1 // one claim per call; renewals ignore MaxAttempts
	if p.Observer == nil {
		p.Observer = opts.Observer
	}
	return c, &lease.Options{
		TTL: c.ttl, Owner: opts.Owner, Mode: opts.Mode, Clock: opts.Clock, ResolveTimeout: c.resolve,
		Retry: p, Retain: "expireAt", RetainFor: c.retention, Observer: opts.Observer,
	}, nil
}

// settling is how Keys settle a lost reply: one try per re-read (a failed
// one leaves the outcome unknown), for up to ResolveTimeout.
func (c config) settling() settle.Config {
	return settle.Config{Retry: retry.Policy{MaxAttempts: 1}, ResolveTimeout: c.resolve}
}

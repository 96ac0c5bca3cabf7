package retry

import (
	"math"
	"time"
)

// Backoff is a sequence of delays, one per retry, that a Policy describes.
// Use it to drive a retry loop that Do does not fit, such as a lease renewal
// ticker. A Backoff is not safe for concurrent use: make one per loop with
// Policy.NewBackoff.
type Backoff interface {
	// Next returns the delay before the next retry. It never returns a
	// negative duration, nor more than the Policy's MaxInterval.
	Next() time.Duration
	// Reset starts the sequence again from its first delay.
	Reset()
}

// NewBackoff returns a fresh sequence of delays that follows p's
// InitialInterval, MaxInterval, Multiplier, Jitter and Rand; fields that
// Validate would reject take their defaults. The caller's loop enforces
// MaxAttempts, MaxElapsedTime, Budget, OnRetry and Clock.
func (p Policy) NewBackoff() Backoff {
	s := p.resolve()
	return newSequence(&s)
}

// sequence implements Backoff. It is not safe for concurrent use.
type sequence struct {
	jitter       Jitter
	initial, max time.Duration
	multiplier   float64
	rand         func() float64
	limit        time.Duration // the cap of the next delay, from initial to max
	prev         time.Duration // DecorrelatedJitter's previous delay
}

func newSequence(s *settings) *sequence {
	seq := &sequence{jitter: s.jitter, initial: s.initial, max: s.max, multiplier: s.multiplier, rand: s.rand}
	seq.Reset()
	return seq
}

func (s *sequence) Reset() { s.limit, s.prev = s.initial, s.initial }

func (s *sequence) Next() time.Duration {
	r := unit(s.rand())
	if s.jitter == DecorrelatedJitter {
		// uniform in [initial, 3×prev), then capped by max.
		hi := min(s.prev, maxDelay/3) * 3
		s.prev = min(s.initial+scale(r, hi-s.initial), s.max)
		return s.prev
	}
	c := s.limit
	if float64(s.limit) >= float64(s.max)/s.multiplier { // also where × would overflow
		s.limit = s.max
	} else {
		s.limit = time.Duration(float64(s.limit) * s.multiplier)
	}
	switch s.jitter {
	case EqualJitter:
		half := c / 2
		return half + scale(r, c-half)
	case NoJitter:
		return c
	default: // FullJitter
		return scale(r, c)
	}
}

// scale returns r×n rounded down, in [0, n) for n > 0 and 0 for n <= 0; r must
// be in [0, 1).
func scale(r float64, n time.Duration) time.Duration {
	if n <= 0 {
		return 0
	}
	d := time.Duration(r * float64(n))
	// r×n may round up to n when n is above 2^53ns.
	return min(max(d, 0), n-1)
}

// unit clamps r into [0, 1); NaN becomes 0.
func unit(r float64) float64 {
	switch {
	case r >= 1:
		return math.Nextafter(1, 0)
	case r > 0:
		return r
	default: // negative or NaN
		return 0
	}
}

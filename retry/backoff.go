package retry

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
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
// InitialInterval, MaxInterval, Multiplier, Jitter and Rand. It does not
// validate p: fields that Validate would reject take their defaults.
// NewBackoff ignores MaxAttempts, MaxElapsedTime, Budget, OnRetry and Clock;
// the caller's loop enforces them.
func (p Policy) NewBackoff() Backoff {
	s := p.resolve()
	return newSequence(&s)
}

// sequence implements Backoff. The exponential caps come from
// github.com/cenkalti/backoff/v4 with no randomization and no elapsed-time
// limit; jitter is applied here, from the Policy's Rand. It is not safe for
// concurrent use.
type sequence struct {
	jitter       Jitter
	initial, max time.Duration
	rand         func() float64
	exp          *backoff.ExponentialBackOff // nil for DecorrelatedJitter
	prev         time.Duration               // DecorrelatedJitter's previous delay
}

func newSequence(s *settings) *sequence {
	seq := &sequence{jitter: s.jitter, initial: s.initial, max: s.max, rand: s.rand, prev: s.initial}
	if s.jitter != DecorrelatedJitter {
		seq.exp = &backoff.ExponentialBackOff{
			InitialInterval:     s.initial,
			RandomizationFactor: 0,
			Multiplier:          s.multiplier,
			MaxInterval:         s.max,
			MaxElapsedTime:      0, // never returns backoff.Stop; Do enforces MaxElapsedTime
			Stop:                backoff.Stop,
			Clock:               zeroClock{}, // elapsed time is unused with MaxElapsedTime 0
		}
		seq.exp.Reset()
	}
	return seq
}

func (s *sequence) Reset() {
	s.prev = s.initial
	if s.exp != nil {
		s.exp.Reset()
	}
}

func (s *sequence) Next() time.Duration {
	r := unit(s.rand())
	if s.jitter == DecorrelatedJitter {
		// uniform in [initial, 3×prev), then capped by max.
		lo := s.initial
		hi := min(s.prev, maxDelay/3) * 3
		d := lo + scale(r, hi-lo)
		s.prev = min(d, s.max)
		return s.prev
	}
	c := min(s.exp.NextBackOff(), s.max) // the cap; the first one is InitialInterval
	c = max(c, 0)
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

// defaultRand is the jitter source when Policy.Rand is nil.
func defaultRand() float64 { return rand.Float64() }

// zeroClock is the ExponentialBackOff's clock, unused with MaxElapsedTime 0.
type zeroClock struct{}

func (zeroClock) Now() time.Time { return time.Time{} }

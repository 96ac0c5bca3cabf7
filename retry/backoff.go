package retry

import (
	"math"
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
// InitialInterval, MaxInterval, Multiplier, Jitter and Rand; fields that
// Validate would reject take their defaults. The caller's loop enforces
// MaxAttempts, MaxElapsedTime, Budget, OnRetry and Clock.
func (p Policy) NewBackoff() Backoff {
	s := p.resolve()
	return newSequence(&s)
}

// sequence implements Backoff on backoff/v4's ExponentialBackOff, which
// gives the cap of each delay (InitialInterval, then × Multiplier up to
// MaxInterval, with no randomization) on the Policy's Clock; the jitter is
// drawn below the cap with the Policy's Rand. DecorrelatedJitter keeps its
// own recurrence. One sequence serves one loop: neither it nor
// ExponentialBackOff is safe for concurrent use. It is one allocation.
type sequence struct {
	exp    backoff.ExponentialBackOff
	jitter Jitter
	rand   func() float64
	prev   time.Duration // DecorrelatedJitter's previous delay
}

func newSequence(s *settings) *sequence {
	seq := &sequence{
		exp: backoff.ExponentialBackOff{
			InitialInterval: s.initial,
			MaxInterval:     s.max,
			Multiplier:      s.multiplier,
			// RandomizationFactor 0: NextBackOff returns the cap itself, and
			// Next draws below it (see the Jitter doc). MaxElapsedTime 0: Do
			// applies it to the drawn delay (see the package doc).
			Stop:  backoff.Stop,
			Clock: s.clock, // a store.Clock is a backoff.Clock
		},
		jitter: s.jitter,
		rand:   s.rand,
	}
	seq.Reset()
	return seq
}

func (s *sequence) Reset() {
	s.exp.Reset()
	s.prev = s.exp.InitialInterval
}

func (s *sequence) Next() time.Duration {
	r := unit(s.rand())
	if s.jitter == DecorrelatedJitter {
		// uniform in [initial, 3×prev), then capped by max.
		hi := min(s.prev, maxDelay/3) * 3
		lo := s.exp.InitialInterval
		s.prev = min(lo+scale(r, hi-lo), s.exp.MaxInterval)
		return s.prev
	}
	c := s.exp.NextBackOff() // the cap: in [InitialInterval, MaxInterval], never Stop
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

package retry_test

import (
	"math"
	"testing"
	"time"

	"github.com/mongocas/mongocas/retry"
)

// wantInterval resolves InitialInterval and MaxInterval of a valid Policy as
// the Policy documentation says.
func wantIntervals(p retry.Policy) (initial, maxInterval time.Duration) {
	const limit = time.Duration(1 << 62)
	initial, maxInterval = min(p.InitialInterval, limit), min(p.MaxInterval, limit)
	switch {
	case initial == 0 && maxInterval == 0:
		return 5 * ms, 200 * ms
	case initial == 0:
		return min(5*ms, maxInterval), maxInterval
	case maxInterval == 0:
		return initial, max(200*ms, initial)
	}
	return initial, maxInterval
}

// nextCap is the documented recurrence cap(n+1) = min(MaxInterval,
// cap(n)×Multiplier), computed as backoff v4 does: comparing with
// MaxInterval/Multiplier first, so that the product never overflows.
func nextCap(c, maxInterval time.Duration, m float64) time.Duration {
	if float64(c) >= float64(maxInterval)/m {
		return maxInterval
	}
	return min(time.Duration(float64(c)*m), maxInterval)
}

func FuzzJitterBounds(f *testing.F) {
	f.Add(int64(0), int64(0), 0.0, uint8(0), 0.5, 0.0, 0.999, uint8(20))
	f.Add(int64(5e6), int64(200e6), 2.0, uint8(1), 0.0, 0.999999, 0.5, uint8(30))
	f.Add(int64(1), int64(1), 1.0, uint8(2), 0.3, 0.3, 0.3, uint8(5))
	f.Add(int64(1e6), int64(1e9), 1.5, uint8(3), 0.999999999, 0.1, 0.7, uint8(40))
	f.Add(int64(10e6), int64(100e6), 2.0, uint8(3), 0.5, 0.5, 0.5, uint8(8))
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), 1e300, uint8(0), 0.999, 1.0, -1.0, uint8(10))
	f.Add(int64(1<<61), int64(1<<62), 3.0, uint8(3), 0.999, 0.999, 0.999, uint8(10))
	f.Add(int64(3), int64(0), 7.0, uint8(1), math.NaN(), math.Inf(1), math.Inf(-1), uint8(64))
	f.Add(int64(-1), int64(-5), 0.5, uint8(200), 0.5, 0.5, 0.5, uint8(3)) // invalid: defaults
	f.Fuzz(func(t *testing.T, initialNs, maxNs int64, mult float64, jitter uint8, r1, r2, r3 float64, n uint8) {
		rs := []float64{r1, r2, r3}
		i := 0
		p := retry.Policy{
			InitialInterval: time.Duration(initialNs),
			MaxInterval:     time.Duration(maxNs),
			Multiplier:      mult,
			Jitter:          retry.Jitter(jitter % 5), // 4 is invalid
			Rand: func() float64 {
				r := rs[i%len(rs)]
				i++
				return r
			},
		}
		b := p.NewBackoff()
		if p.Validate() != nil {
			// Invalid fields take their defaults: still within [0, 2^62].
			for range int(n) {
				if d := b.Next(); d < 0 || d > 1<<62 {
					t.Fatalf("invalid policy %+v: delay %v out of range", p, d)
				}
			}
			return
		}
		initial, maxInterval := wantIntervals(p)
		m := mult
		if m == 0 {
			m = 2
		}
		c, prev := initial, initial
		for k := range int(n) {
			d := b.Next()
			if d < 0 || d > maxInterval {
				t.Fatalf("delay %d = %v outside [0, MaxInterval %v]", k, d, maxInterval)
			}
			switch p.Jitter {
			case retry.FullJitter:
				if d >= c {
					t.Fatalf("full jitter delay %d = %v outside [0, %v)", k, d, c)
				}
			case retry.EqualJitter:
				if d < c/2 || d >= c {
					t.Fatalf("equal jitter delay %d = %v outside [%v, %v)", k, d, c/2, c)
				}
			case retry.NoJitter:
				if d != c {
					t.Fatalf("no jitter delay %d = %v, want cap %v", k, d, c)
				}
			case retry.DecorrelatedJitter:
				hi := min(maxInterval, min(prev, time.Duration(math.MaxInt64/3))*3)
				if d < initial || d > hi {
					t.Fatalf("decorrelated delay %d = %v outside [%v, %v]", k, d, initial, hi)
				}
				prev = d
			}
			c = nextCap(c, maxInterval, m)
		}
	})
}

package retry_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/retry"
)

const ms = time.Millisecond

// next returns the first n delays of b.
func next(b retry.Backoff, n int) []time.Duration {
	ds := make([]time.Duration, n)
	for i := range ds {
		ds[i] = b.Next()
	}
	return ds
}

func TestBackoffSequences(t *testing.T) {
	t.Parallel()
	// Caps: 10, 20, 40, 80, 100, 100 (ms).
	base := retry.Policy{InitialInterval: 10 * ms, MaxInterval: 100 * ms, Multiplier: 2}
	almostOne := math.Nextafter(1, 0)
	cases := []struct {
		name   string
		jitter retry.Jitter
		rand   func() float64
		want   []time.Duration
	}{
		{"full/half", retry.FullJitter, constRand(0.5), []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 50 * ms, 50 * ms}},
		{"full/zero", retry.FullJitter, constRand(0), []time.Duration{0, 0, 0, 0, 0, 0}},
		{"full/almost-one", retry.FullJitter, constRand(almostOne), []time.Duration{10*ms - 1, 20*ms - 1, 40*ms - 1, 80*ms - 1, 100*ms - 1, 100*ms - 1}},
		{"full/mixed", retry.FullJitter, seqRand(0.1, 0.9, 0.25), []time.Duration{1 * ms, 18 * ms, 10 * ms, 8 * ms, 90 * ms, 25 * ms}},
		{"equal/half", retry.EqualJitter, constRand(0.5), []time.Duration{7500 * time.Microsecond, 15 * ms, 30 * ms, 60 * ms, 75 * ms, 75 * ms}},
		{"equal/zero", retry.EqualJitter, constRand(0), []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 50 * ms, 50 * ms}},
		{"equal/almost-one", retry.EqualJitter, constRand(almostOne), []time.Duration{10*ms - 1, 20*ms - 1, 40*ms - 1, 80*ms - 1, 100*ms - 1, 100*ms - 1}},
		{"none", retry.NoJitter, constRand(0.5), []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 100 * ms, 100 * ms}},
		// prev starts at 10: 10+0.5×(30-10)=20, 10+0.5×(60-10)=35, 10+0.5×(105-10)=57.5,
		// 10+0.5×(172.5-10)=91.25, then 141.875 and 155 are capped to 100.
		{"decorrelated/half", retry.DecorrelatedJitter, constRand(0.5), []time.Duration{20 * ms, 35 * ms, 57500 * time.Microsecond, 91250 * time.Microsecond, 100 * ms, 100 * ms}},
		{"decorrelated/zero", retry.DecorrelatedJitter, constRand(0), []time.Duration{10 * ms, 10 * ms, 10 * ms, 10 * ms, 10 * ms, 10 * ms}},
		// 10+(30-10)×r just below 30, then 90, then capped at 100.
		{"decorrelated/almost-one", retry.DecorrelatedJitter, constRand(almostOne), []time.Duration{30*ms - 1, 90*ms - 4, 100 * ms, 100 * ms, 100 * ms, 100 * ms}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := base
			p.Jitter = tc.jitter
			p.Rand = tc.rand
			b := p.NewBackoff()
			got := next(b, len(tc.want))
			require.Equal(t, tc.want, got)
		})
	}
}

func TestBackoffReset(t *testing.T) {
	t.Parallel()
	for _, j := range []retry.Jitter{retry.FullJitter, retry.EqualJitter, retry.NoJitter, retry.DecorrelatedJitter} {
		p := retry.Policy{InitialInterval: 10 * ms, MaxInterval: 100 * ms, Jitter: j, Rand: constRand(0.5)}
		b := p.NewBackoff()
		first := next(b, 5)
		b.Reset()
		require.Equal(t, first, next(b, 5), j.String())
	}
}

func TestBackoffDefaults(t *testing.T) {
	t.Parallel()
	// The zero Policy and Default() give the same sequence: caps 5, 10, 20, …, 160, 200.
	want := []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 200 * ms, 200 * ms}
	for _, p := range []retry.Policy{{}, retry.Default()} {
		p.Jitter = retry.NoJitter
		require.Equal(t, want, next(p.NewBackoff(), len(want)))
	}
	// Full jitter is the default.
	p := retry.Policy{Rand: constRand(0.5)}
	require.Equal(t, []time.Duration{2500 * time.Microsecond, 5 * ms}, next(p.NewBackoff(), 2))
}

func TestBackoffIntervalResolution(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		p    retry.Policy
		want []time.Duration
	}{
		// A MaxInterval below the default InitialInterval lowers it.
		{"small max", retry.Policy{MaxInterval: 2 * ms}, []time.Duration{2 * ms, 2 * ms}},
		// An InitialInterval above the default MaxInterval raises it.
		{"large initial", retry.Policy{InitialInterval: time.Second}, []time.Duration{time.Second, time.Second}},
		{"multiplier 1", retry.Policy{InitialInterval: 3 * ms, Multiplier: 1}, []time.Duration{3 * ms, 3 * ms, 3 * ms}},
		{"multiplier 1.5", retry.Policy{InitialInterval: 4 * ms, Multiplier: 1.5}, []time.Duration{4 * ms, 6 * ms, 9 * ms, 13500 * time.Microsecond}},
		// NewBackoff does not validate: invalid fields take their defaults.
		// (the unknown Jitter becomes FullJitter: half of 5ms and of 10ms).
		{"invalid", retry.Policy{InitialInterval: -1, MaxInterval: -1, Multiplier: 0.5, Jitter: 42, Rand: constRand(0.5)}, []time.Duration{2500 * time.Microsecond, 5 * ms}},
		{"huge", retry.Policy{InitialInterval: math.MaxInt64, MaxInterval: math.MaxInt64}, []time.Duration{1 << 62, 1 << 62}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := tc.p
			if p.Jitter == retry.FullJitter {
				p.Jitter = retry.NoJitter
			}
			require.Equal(t, tc.want, next(p.NewBackoff(), len(tc.want)))
		})
	}
}

func TestBackoffClampsRand(t *testing.T) {
	t.Parallel()
	cases := []struct {
		r    float64
		want time.Duration
	}{
		{-1, 0},
		{math.NaN(), 0},
		{math.Inf(-1), 0},
		{1, 10*ms - 1},
		{7, 10*ms - 1},
		{math.Inf(1), 10*ms - 1},
	}
	for _, tc := range cases {
		p := retry.Policy{InitialInterval: 10 * ms, Rand: constRand(tc.r)}
		require.Equal(t, tc.want, p.NewBackoff().Next(), "rand %v", tc.r)
	}
}

func TestJitterString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "FullJitter", retry.FullJitter.String())
	require.Equal(t, "EqualJitter", retry.EqualJitter.String())
	require.Equal(t, "NoJitter", retry.NoJitter.String())
	require.Equal(t, "DecorrelatedJitter", retry.DecorrelatedJitter.String())
	require.Equal(t, "Jitter(9)", retry.Jitter(9).String())
}

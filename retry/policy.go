package retry

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/store"
)

// The defaults of the Policy fields, which a zero field takes.
const (
	DefaultInitialInterval = 5 * time.Millisecond   // cap of the first delay
	DefaultMaxInterval     = 200 * time.Millisecond // cap of any delay
	DefaultMultiplier      = 2.0                    // growth of the cap
	DefaultMaxAttempts     = 10                     // calls of fn, the first included
	DefaultMaxElapsedTime  = 2 * time.Second        // time after which Do stops retrying
)

// maxDelay (about 146 years) bounds every interval, so that no arithmetic on
// durations overflows.
const maxDelay = time.Duration(1 << 62)

// Policy says how often and how long Do retries a failing function. Each
// zero field takes its default (see Default). A Policy is a plain value:
// copy it and share it freely, provided that its Rand, OnRetry and Clock are
// safe for concurrent use.
//
// The delay before retry n (n = 1 for the first retry) is drawn below a cap
// that grows exponentially (backoff/v4's ExponentialBackOff interval, with no
// randomization of its own; see the package doc):
//
//	cap(1)   = InitialInterval
//	cap(n+1) = min(MaxInterval, cap(n) × Multiplier)
//
// and Jitter says how the delay is drawn below that cap. DecorrelatedJitter
// uses its own recurrence instead (see its documentation).
type Policy struct {
	// InitialInterval is the cap of the first delay. Zero means 5ms, or
	// MaxInterval if MaxInterval is set and smaller. Negative is invalid.
	InitialInterval time.Duration

	// MaxInterval is the cap of any delay. Zero means 200ms, or
	// InitialInterval if InitialInterval is set and larger. Negative is
	// invalid, and so is a MaxInterval below an explicit InitialInterval.
	// Values above 2^62ns (about 146 years) act as 2^62ns.
	MaxInterval time.Duration

	// Multiplier is the factor by which the cap grows after each retry. Zero
	// means 2. Values below 1, NaN and infinities are invalid.
	// DecorrelatedJitter ignores it.
	Multiplier float64

	// Jitter says how a delay is drawn below its cap. The zero value is
	// FullJitter, the default.
	Jitter Jitter

	// MaxAttempts is the maximum number of calls of fn, the first included,
	// so MaxAttempts 1 means no retry. Zero means 10; negative means
	// unlimited (MaxElapsedTime, the Budget and the context still bound the
	// retries).
	MaxAttempts int

	// MaxElapsedTime bounds the time Do spends, measured on Clock from the
	// first call of fn: Do never starts a sleep that would end after it. Zero
	// means 2s; negative means unlimited (the context still bounds it).
	MaxElapsedTime time.Duration

	// Budget, if not nil, is a token bucket shared by every Do call that uses
	// it: each retry takes a token; when none is left Do stops with a
	// *BudgetExhaustedError. Nil means no budget.
	Budget *Budget

	// OnRetry, if not nil, is called before each sleep with the facts of
	// the attempt that failed, for logs and metrics. It runs on the goroutine
	// that called Do and must not block for long. Nil means none.
	OnRetry func(Attempt)

	// Observer, if not nil, receives an observe.Retry event before each
	// sleep (after OnRetry) and an observe.BudgetRefused event when the
	// Budget refuses a retry, with Do's context. Nil means none, at no cost.
	Observer observe.Observer

	// Clock supplies the current time and the timers Do sleeps on; tests
	// inject a fake one. Nil means store.SystemClock().
	Clock store.Clock

	// Rand returns a pseudo-random number in [0, 1) for jitter (values
	// outside are clamped into it). Nil means math/rand/v2's Float64.
	Rand func() float64
}

// Jitter selects how a delay is drawn below its cap.
type Jitter int

const (
	// FullJitter draws each delay uniformly in [0, cap). It spreads
	// competing clients the most and is the default.
	FullJitter Jitter = iota

	// EqualJitter draws each delay uniformly in [cap/2, cap): it keeps at
	// least half of the exponential wait.
	EqualJitter

	// NoJitter uses the cap itself as the delay. Use it only where a single
	// client retries, or in tests.
	NoJitter

	// DecorrelatedJitter is the AWS "decorrelated jitter" recurrence: the
	// delay is min(MaxInterval, uniform in [InitialInterval, previous×3)),
	// where the previous delay starts at InitialInterval. It ignores
	// Multiplier.
	DecorrelatedJitter
)

var jitterNames = [...]string{"FullJitter", "EqualJitter", "NoJitter", "DecorrelatedJitter"}

// String returns the name of the jitter kind, such as "FullJitter".
func (j Jitter) String() string {
	if j >= FullJitter && j <= DecorrelatedJitter {
		return jitterNames[j]
	}
	return fmt.Sprintf("Jitter(%d)", int(j))
}

// Default returns the default Policy with every numeric field filled in
// (the Default constants, FullJitter) and the others nil: Do(ctx, Default(),
// fn) behaves exactly like Do(ctx, Policy{}, fn).
func Default() Policy {
	return Policy{
		InitialInterval: DefaultInitialInterval,
		MaxInterval:     DefaultMaxInterval,
		Multiplier:      DefaultMultiplier,
		Jitter:          FullJitter,
		MaxAttempts:     DefaultMaxAttempts,
		MaxElapsedTime:  DefaultMaxElapsedTime,
	}
}

// Validate reports the first invalid field of p as a *ConfigError
// (ErrInvalidPolicy), or nil if p is valid. Zero fields are valid: they mean
// their defaults. Do calls Validate before it calls fn.
func (p Policy) Validate() error {
	switch {
	case p.InitialInterval < 0:
		return &ConfigError{Field: "InitialInterval", Reason: fmt.Sprintf("%v is negative", p.InitialInterval)}
	case p.MaxInterval < 0:
		return &ConfigError{Field: "MaxInterval", Reason: fmt.Sprintf("%v is negative", p.MaxInterval)}
	case p.InitialInterval > 0 && p.MaxInterval > 0 && p.InitialInterval > p.MaxInterval:
		return &ConfigError{Field: "MaxInterval", Reason: fmt.Sprintf("%v is below InitialInterval %v", p.MaxInterval, p.InitialInterval)}
	case math.IsNaN(p.Multiplier) || math.IsInf(p.Multiplier, 0):
		return &ConfigError{Field: "Multiplier", Reason: fmt.Sprintf("%v is not a finite number", p.Multiplier)}
	case p.Multiplier != 0 && p.Multiplier < 1:
		return &ConfigError{Field: "Multiplier", Reason: fmt.Sprintf("%v is below 1", p.Multiplier)}
	case p.Jitter < FullJitter || p.Jitter > DecorrelatedJitter:
		return &ConfigError{Field: "Jitter", Reason: fmt.Sprintf("%v is not a known jitter kind", p.Jitter)}
	case p.Budget != nil && p.Budget.err != "":
		return &ConfigError{Field: "Budget", Reason: p.Budget.err}
	}
	return nil
}

// settings is a Policy with its defaults resolved and values clamped.
type settings struct {
	initial, max time.Duration
	multiplier   float64
	jitter       Jitter
	maxAttempts  int           // <= 0: unlimited
	maxElapsed   time.Duration // <= 0: unlimited
	budget       *Budget
	onRetry      func(Attempt)
	observer     observe.Observer
	clock        store.Clock
	rand         func() float64
}

// resolve fills in the defaults of p. Fields that Validate rejects are
// replaced by their defaults, so resolve never fails.
func (p Policy) resolve() settings {
	s := settings{
		initial:     min(max(p.InitialInterval, 0), maxDelay),
		max:         min(max(p.MaxInterval, 0), maxDelay),
		multiplier:  p.Multiplier,
		jitter:      p.Jitter,
		maxAttempts: cmp.Or(p.MaxAttempts, DefaultMaxAttempts),
		maxElapsed:  cmp.Or(p.MaxElapsedTime, DefaultMaxElapsedTime),
		budget:      p.Budget,
		onRetry:     p.OnRetry,
		observer:    p.Observer,
		clock:       p.Clock,
		rand:        p.Rand,
	}
	switch {
	case s.initial == 0 && s.max == 0:
		s.initial, s.max = DefaultInitialInterval, DefaultMaxInterval
	case s.initial == 0:
		s.initial = min(DefaultInitialInterval, s.max)
	case s.max == 0:
		s.max = max(DefaultMaxInterval, s.initial)
	case s.initial > s.max:
		s.initial = s.max
	}
	if !(s.multiplier >= 1) || math.IsInf(s.multiplier, 0) { // also catches NaN
		s.multiplier = DefaultMultiplier
	}
	if s.jitter < FullJitter || s.jitter > DecorrelatedJitter {
		s.jitter = FullJitter
	}
	if s.clock == nil {
		s.clock = store.SystemClock()
	}
	if s.rand == nil {
		s.rand = rand.Float64
	}
	return s
}

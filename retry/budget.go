package retry

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/mongocas/mongocas/store"
)

// Budget is a retry budget: a token bucket shared by every Do call whose
// Policy points to it, so that a storm of conflicts or failures cannot turn
// into a storm of retries. Each retry takes one token (first attempts take
// none); when the bucket is empty, Do stops at once with a
// *BudgetExhaustedError. A Budget is safe for concurrent use. Make it with
// NewBudget; never copy it.
type Budget struct {
	mu       sync.Mutex
	clock    store.Clock   // nil: the clock of the Policy in use
	interval time.Duration // time to earn one token; 0: no refill
	burst    int
	tokens   int
	acc      time.Duration // time earned towards the next token, < interval
	last     time.Time     // the latest time refill has counted up to
	started  bool          // last is set
	err      string        // why the arguments were invalid, reported by Policy.Validate
}

// BudgetOption configures a Budget made by NewBudget.
type BudgetOption func(*Budget)

// WithBudgetClock makes the Budget refill on clock instead of on the Clock of
// each Policy that uses it (Policies with different clocks, a fake clock).
func WithBudgetClock(clock store.Clock) BudgetOption {
	return func(b *Budget) { b.clock = clock }
}

// NewBudget returns a full Budget that holds at most burst tokens and earns
// perSecond tokens per second. perSecond 0 means no refill: the Budget allows
// burst retries in its whole life. burst 0 forbids every retry.
//
// Tokens are refilled on the clock given by WithBudgetClock, or else on the
// Clock of the Policy of the Do call that takes the token; use one time
// source per Budget. The Budget never grants more than burst plus perSecond
// tokens per second of its clock, under any contention, also when the clock
// steps back. The clock's Now is called with the Budget's lock held. A
// negative, NaN or infinite perSecond, or a negative burst, makes every
// Policy that uses the Budget invalid: Policy.Validate and Do report a
// *ConfigError.
func NewBudget(perSecond float64, burst int, opts ...BudgetOption) *Budget {
	b := &Budget{burst: max(burst, 0)}
	b.tokens = b.burst
	switch {
	case burst < 0:
		b.err = fmt.Sprintf("burst %d is negative", burst)
	case math.IsNaN(perSecond) || math.IsInf(perSecond, 0) || perSecond < 0:
		b.err = fmt.Sprintf("perSecond %v is not a finite number >= 0", perSecond)
	case perSecond > 0:
		iv := float64(time.Second) / perSecond
		b.interval = time.Duration(min(max(iv, 1), float64(maxDelay)))
	}
	for _, opt := range opts {
		opt(b)
	}
	return b
}

// take takes one token if one is left, after refilling the bucket.
func (b *Budget) take(clock store.Clock) bool {
	if b.clock != nil {
		clock = b.clock
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(clock.Now())
	if b.tokens == 0 {
		return false
	}
	b.tokens--
	return true
}

// refill adds the tokens earned since the latest time it has counted; an
// earlier now earns nothing. b.mu must be held.
func (b *Budget) refill(now time.Time) {
	if !b.started {
		b.last, b.started = now, true
		return
	}
	d := now.Sub(b.last)
	if d <= 0 {
		return
	}
	b.last = now
	if b.interval == 0 {
		return
	}
	if b.tokens >= b.burst {
		b.acc = 0
		return
	}
	// d and acc are below 2^63, and acc < interval: no overflow below.
	if n := d / b.interval; n >= time.Duration(b.burst-b.tokens) {
		b.tokens, b.acc = b.burst, 0
		return
	}
	b.acc += d % b.interval
	earned := int(d/b.interval + b.acc/b.interval)
	b.acc %= b.interval
	b.tokens = min(b.tokens+earned, b.burst)
	if b.tokens == b.burst {
		b.acc = 0
	}
}

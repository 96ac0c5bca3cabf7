package versioned

import (
	"time"

	"github.com/mongocas/mongocas/retry"
)

// Modify's retry defaults, for the zero fields of Options.Retry (and of a
// WithRetry policy).
const (
	// DefaultRetryTime bounds the time Modify spends retrying conflicts
	// (retry.Policy.MaxElapsedTime). The number of attempts is not bounded
	// (MaxAttempts -1): the time, the budget and ctx bound them.
	DefaultRetryTime = 10 * time.Second

	// DefaultRetryBudget is the rate, in retries per second, of the retry
	// budget each Repo makes for itself when Options.Retry has none; it
	// holds up to twice as many. Every retry of a conflict (and of a re-read
	// after an ambiguous write) takes a token, so a storm of conflicts
	// cannot turn into a storm of writes: when the bucket is empty, Modify
	// fails at once with an error matching retry.ErrBudgetExhausted. Calls
	// on one document in one process wait in line instead of conflicting, so
	// at most one retry per document and process is pending at any time.
	DefaultRetryBudget = 100
)

// withDefaults fills the zero fields of p versioned defaults differently
// from the retry package (MaxAttempts, MaxElapsedTime, Budget).
func withDefaults(p retry.Policy, budget *retry.Budget) retry.Policy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = -1
	}
	if p.MaxElapsedTime == 0 {
		p.MaxElapsedTime = DefaultRetryTime
	}
	if p.Budget == nil {
		p.Budget = budget
	}
	return p
}

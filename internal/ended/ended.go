// Package ended names how an operation of the library ended, for
// observe.Event.Outcome: one classification, in one order, for every package.
package ended

import (
	"context"
	"errors"

	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// Rule names the outcome of the errors that match Err (errors.Is).
type Rule struct {
	Err     error
	Outcome observe.Outcome
}

// Outcome returns the outcome of an operation that returned err: OK for nil;
// else the first that matches of bad input, an unknown outcome, a refused
// retry, the package's own rules in their order, an ended context, retries
// used up; else OutcomeError. It allocates nothing.
func Outcome(err error, rules ...Rule) observe.Outcome {
	switch {
	case err == nil:
		return observe.OK
	case errors.Is(err, store.ErrInvalid):
		return observe.OutcomeInvalid
	case errors.Is(err, store.ErrUnknownOutcome):
		return observe.OutcomeUnknown
	case errors.Is(err, retry.ErrBudgetExhausted):
		return observe.OutcomeBudget
	}
	for _, r := range rules {
		if errors.Is(err, r.Err) {
			return r.Outcome
		}
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return observe.OutcomeCanceled
	case errors.Is(err, retry.ErrExhausted):
		return observe.OutcomeExhausted
	}
	return observe.OutcomeError
}

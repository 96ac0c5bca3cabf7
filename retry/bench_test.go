package retry_test

import (
	"context"
	"testing"

	"github.com/mongocas/mongocas/retry"
)

var sink int

//go:noinline
func work(context.Context) error {
	sink++
	return nil
}

// BenchmarkDoSuccess measures the overhead of Do when the first attempt
// succeeds, against calling fn directly.
func BenchmarkDoSuccess(b *testing.B) {
	ctx := context.Background()
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = work(ctx)
		}
	})
	b.Run("Do", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = retry.Do(ctx, retry.Policy{}, work)
		}
	})
	b.Run("Do/budget", func(b *testing.B) {
		b.ReportAllocs()
		p := retry.Policy{Budget: retry.NewBudget(10, 10), OnRetry: func(retry.Attempt) {}}
		for b.Loop() {
			_ = retry.Do(ctx, p, work)
		}
	})
	b.Run("DoValue", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = retry.DoValue(ctx, retry.Policy{}, func(ctx context.Context) (int, error) { return sink, work(ctx) })
		}
	})
}

// errAgain is retryable and preallocated, so that BenchmarkDoRetried counts
// Do's allocations alone.
var errAgain = againError{}

type againError struct{}

func (againError) Error() string   { return "again" }
func (againError) Retryable() bool { return true }

// BenchmarkDoRetried measures a call whose first attempt fails with a
// retryable error and whose second succeeds: the delay sequence Do builds at
// the first retry. Rand 0 makes the full-jitter delay 0, so no timer is
// counted.
func BenchmarkDoRetried(b *testing.B) {
	ctx := context.Background()
	p := retry.Policy{Rand: func() float64 { return 0 }}
	b.ReportAllocs()
	for b.Loop() {
		first := true
		err := retry.Do(ctx, p, func(context.Context) error {
			if first {
				first = false
				return errAgain
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

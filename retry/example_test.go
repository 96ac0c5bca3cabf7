package retry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/retry"
)

func ExampleDo() {
	// A write that hits two write conflicts, then succeeds. NoJitter and
	// microsecond intervals keep the output deterministic and the example fast;
	// real code keeps the full-jitter defaults.
	p := retry.Policy{
		InitialInterval: time.Microsecond,
		Jitter:          retry.NoJitter,
		OnRetry: func(a retry.Attempt) {
			fmt.Printf("attempt %d failed: %v; retrying in %v\n", a.Number, a.Err, a.Delay)
		},
	}
	calls := 0
	err := retry.Do(context.Background(), p, func(ctx context.Context) error {
		calls++
		if calls < 3 {
			return mongo.CommandError{Code: 112, Name: "WriteConflict", Message: "write conflict"}
		}
		return nil
	})
	fmt.Println("calls:", calls, "error:", err)
	// Output:
	// attempt 1 failed: (WriteConflict) write conflict; retrying in 1µs
	// attempt 2 failed: (WriteConflict) write conflict; retrying in 2µs
	// calls: 3 error: <nil>
}

func ExampleDoValue() {
	calls := 0
	n, err := retry.DoValue(context.Background(), retry.Policy{InitialInterval: time.Microsecond},
		func(ctx context.Context) (int, error) {
			calls++
			if calls == 1 {
				return 0, mongo.CommandError{Labels: []string{"NetworkError"}, Message: "connection reset"}
			}
			return 42, nil
		})
	fmt.Println(n, err, calls)
	// Output: 42 <nil> 2
}

func ExamplePermanent() {
	errNotFound := errors.New("order not found")
	calls := 0
	err := retry.Do(context.Background(), retry.Policy{}, func(ctx context.Context) error {
		calls++
		// Even a transient-looking failure is not retried once marked permanent.
		return retry.Permanent(fmt.Errorf("load order 17: %w", errNotFound))
	})
	fmt.Println("calls:", calls)
	fmt.Println("error:", err)
	fmt.Println("is errNotFound:", errors.Is(err, errNotFound))
	// Output:
	// calls: 1
	// error: load order 17: order not found
	// is errNotFound: true
}

func ExampleNewBudget() {
	// One budget for the whole process: 2 retries in a burst, then 10 per
	// second. Here the conflict storm uses up the burst at once.
	budget := retry.NewBudget(10, 2)
	p := retry.Policy{InitialInterval: time.Microsecond, Budget: budget}
	conflict := mongo.CommandError{Code: 112, Name: "WriteConflict", Message: "write conflict"}

	for i := 1; i <= 2; i++ {
		calls := 0
		err := retry.Do(context.Background(), p, func(ctx context.Context) error {
			calls++
			return conflict
		})
		var be *retry.BudgetExhaustedError
		fmt.Printf("call %d: %d attempts, budget exhausted: %v\n", i, calls, errors.As(err, &be))
	}
	// Output:
	// call 1: 3 attempts, budget exhausted: true
	// call 2: 1 attempts, budget exhausted: true
}

func ExamplePolicy_NewBackoff() {
	// The delays of a policy, for a loop that Do does not fit. Rand is fixed
	// here to show the sequence; leave it nil in real code.
	p := retry.Policy{
		InitialInterval: 10 * time.Millisecond,
		MaxInterval:     50 * time.Millisecond,
		Jitter:          retry.EqualJitter,
		Rand:            func() float64 { return 0.5 },
	}
	b := p.NewBackoff()
	for range 5 {
		fmt.Println(b.Next())
	}
	// Output:
	// 7.5ms
	// 15ms
	// 30ms
	// 37.5ms
	// 37.5ms
}

func ExampleIsRetryable() {
	network := mongo.CommandError{Labels: []string{"NetworkError"}, Message: "connection reset"}
	fmt.Println(retry.IsRetryable(fmt.Errorf("update: %w", network)))
	fmt.Println(retry.IsRetryable(errors.Join(errors.New("x"), network)))
	fmt.Println(retry.IsRetryable(retry.Permanent(network)))
	fmt.Println(retry.IsRetryable(context.Canceled))
	// Output:
	// true
	// true
	// false
	// false
}

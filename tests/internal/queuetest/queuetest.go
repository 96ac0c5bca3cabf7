// Package queuetest holds what the suite's tests of deferred and of the
// packages built on it (move) do with a queue the same way.
package queuetest

import (
	"context"
	"sync"
	"testing"

	"github.com/mongocas/mongocas/deferred"
)

// Run starts q.Run and returns a function that stops it and waits for it
// to return; the test's cleanup calls it too. An error from Run fails the
// test.
func Run(t testing.TB, q *deferred.Queue) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := q.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

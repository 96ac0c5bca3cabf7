package retry_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mongocas/mongocas/store"
)

// TestMain fails the run when a goroutine running this module's code outlives
// the tests. It does goleak's job with the standard library alone: the root
// module's tests depend on nothing beyond it and testify, so that a user's
// module graph stays small.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := leakedGoroutines(5 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines left running after the tests:\n\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// leakedGoroutines returns the stacks of the goroutines, other than the
// caller's, that run or were started by code of this module, waiting up to
// wait for them to end; "" when there are none.
func leakedGoroutines(wait time.Duration) string {
	deadline := time.Now().Add(wait)
	for {
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		// The caller's goroutine comes first; blank lines separate the others.
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n")[1:] {
			if strings.Contains(g, "github.com/mongocas/mongocas/") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fakeClock is a store.Clock whose time moves only when told. By default its
// timers fire at once and move the time forward by their duration, so a retry
// loop runs to its end without sleeping. With block set, timers never fire and
// each new timer is announced on timers. It is safe for concurrent use.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
	block  bool
	timers chan *fakeTimer
}

var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func newFakeClock() *fakeClock { return &fakeClock{now: epoch} }

// newBlockingClock returns a fakeClock whose timers never fire.
func newBlockingClock() *fakeClock {
	return &fakeClock{now: epoch, block: true, timers: make(chan *fakeTimer, 16)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Sleeps returns the durations of the timers made so far.
func (c *fakeClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

func (c *fakeClock) NewTimer(d time.Duration) store.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	t := &fakeTimer{c: make(chan time.Time, 1)}
	if c.block {
		c.timers <- t
		return t
	}
	c.now = c.now.Add(d)
	t.fired = true
	t.c <- c.now
	return t
}

type fakeTimer struct {
	mu      sync.Mutex
	c       chan time.Time
	fired   bool
	stopped bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	active := !t.fired && !t.stopped
	t.stopped = true
	return active
}

func (t *fakeTimer) Stopped() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stopped
}

// constRand returns a Rand that always returns r.
func constRand(r float64) func() float64 { return func() float64 { return r } }

// seqRand returns a Rand that returns rs in turn, cyclically. It is not safe
// for concurrent use.
func seqRand(rs ...float64) func() float64 {
	i := 0
	return func() float64 {
		r := rs[i%len(rs)]
		i++
		return r
	}
}

// retryableError is an error type that answers Retryable.
type retryableError struct {
	retry bool
	err   error
}

func (e *retryableError) Error() string   { return "retryable(" + e.err.Error() + ")" }
func (e *retryableError) Unwrap() error   { return e.err }
func (e *retryableError) Retryable() bool { return e.retry }

var (
	errConflict = &retryableError{retry: true, err: errors.New("version conflict")}
	errBoom     = errors.New("boom")
)

// counter returns fn that records its calls and returns errs in turn (the
// last one repeatedly), and a func that returns the count.
func counter(errs ...error) (fn func(context.Context) error, calls func() int) {
	var mu sync.Mutex
	n := 0
	fn = func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		n++
		return errs[min(n, len(errs))-1]
	}
	return fn, func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// manualCtx is a context whose end the test controls, without timers: End
// makes it done with the given error.
type manualCtx struct {
	context.Context
	mu   sync.Mutex
	done chan struct{}
	err  error
}

func newManualCtx() *manualCtx {
	return &manualCtx{Context: context.Background(), done: make(chan struct{})}
}

func (c *manualCtx) Done() <-chan struct{} { return c.done }

func (c *manualCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *manualCtx) End(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
	close(c.done)
}

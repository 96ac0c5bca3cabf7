package store

import "time"

// Clock is the local source of time of the packages that wait (retry.Policy,
// lease, deferred): "now" and timers, of which only differences are used.
// SystemClock is the real one; tests inject fakes so that they never sleep.
// Implementations must be safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that sends on its channel once d has passed.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer made by a Clock, like *time.Timer.
type Timer interface {
	// C returns the channel on which the timer sends when it fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing. It reports whether it stopped the
	// timer, false if the timer had already fired or been stopped.
	Stop() bool
}

// SystemClock returns the Clock of time.Now (whose differences use the
// monotonic clock) and time.NewTimer.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time                 { return time.Now() }
func (systemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.t.C }
func (t systemTimer) Stop() bool          { return t.t.Stop() }

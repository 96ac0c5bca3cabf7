package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mongocas/mongocas/retry"
)

// Do runs fn under the lease on id. It acquires the lease as Acquire does
// (waiting while another owner holds it), renews it in the background every
// Options.RenewEvery, and releases it when fn returns, also when fn panics
// (the panic then continues). fn's context is the lease's context, derived
// from ctx: it ends when ctx ends, when a renewal finds the lease taken over,
// or at the local deadline when no renewal succeeded in time, with a
// *LostError as its cause. fn must stop promptly when its context ends, and
// should fence its writes with l.Fence or l.Guard.
//
// Do returns the error of acquiring; otherwise fn's error, wrapped in a
// *LostError (which matches both ErrLost and fn's error) if the lease was lost
// while fn ran; otherwise, if releasing failed, the release error (joined with
// fn's error, if any). No goroutine of Do outlives it.
func (m *Manager) Do(ctx context.Context, id any, fn func(ctx context.Context, l *Lease) error) (err error) {
	if fn == nil {
		return fmt.Errorf("lease: Do %v: nil function: %w", id, ErrInvalidOptions)
	}
	if err := m.check(ctx, "acquire", id); err != nil {
		return err
	}
	l, err := m.acquire(ctx, id, ctx)
	if err != nil {
		return err
	}

	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		l.keepAlive(stop)
	}()

	var fnErr error
	returned := false
	defer func() {
		close(stop)
		<-stopped
		rctx, cancel := m.detached(ctx)
		relErr := l.Release(rctx)
		cancel()
		if !returned {
			return // fn panicked or called runtime.Goexit: let that go on
		}
		var lost *LostError
		switch {
		case errors.As(relErr, &lost), errors.As(l.Err(), &lost):
			err = lost.withErr(fnErr)
		case relErr != nil && fnErr != nil:
			err = errors.Join(fnErr, relErr)
		case relErr != nil:
			err = relErr
		default:
			err = fnErr
		}
	}()
	fnErr = fn(l.ctx, l)
	returned = true
	return nil // replaced by the deferred function
}

// keepAlive renews l every RenewEvery until stop is closed or the lease's
// context ends. A failed renewal is retried after a short jittered delay
// while the local deadline allows; if none succeeds in time, the deadline
// timer ends the lease. A renewal that finds the lease lost ends it at once.
func (l *Lease) keepAlive(stop <-chan struct{}) {
	every := l.m.c.renewEvery
	bo := retry.Policy{
		InitialInterval: max(every/20, time.Millisecond),
		MaxInterval:     max(every/4, time.Millisecond),
	}.NewBackoff()
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		left := l.TimeLeft()
		if left <= 0 {
			// The deadline timer ends the lease; wait for it (or stop).
			t.Reset(time.Millisecond)
			continue
		}
		rctx, cancel := context.WithTimeout(l.ctx, left)
		err := l.Renew(rctx)
		cancel()
		switch {
		case err == nil:
			bo.Reset()
			t.Reset(every)
		case errors.Is(err, ErrLost), errors.Is(err, ErrReleased):
			return
		default:
			t.Reset(min(bo.Next(), max(l.TimeLeft(), time.Millisecond)))
		}
	}
}

package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/retry"
)

// Do runs fn under the lease on id. It acquires the lease as Acquire does
// (waiting in line behind other calls of this process, and while another
// owner holds it), renews it in the background every
// Options.RenewEvery, and releases it when fn returns, also when fn panics
// (the panic then continues). fn's context is the lease's context, derived
// from ctx: it ends when ctx ends, when a renewal finds the lease taken over,
// or at the local deadline when no renewal succeeded in time, with a
// *LostError as its cause. fn must stop promptly when its context ends, and
// should fence its writes with l.Fence.
//
// Do returns the error of acquiring; otherwise fn's error, wrapped in a
// *LostError (which matches both ErrLost and fn's error) if the lease was lost
// while fn ran; otherwise, if releasing failed, the release error (joined with
// fn's error, if any). fn may release the lease itself (Release,
// ReleaseWith); Do then sends no release. No goroutine of Do outlives it.
func (m *Manager) Do(ctx context.Context, id any, fn func(ctx context.Context, l *Lease) error) (err error) {
	return m.do(ctx, id, nil, fn)
}

// do is Do, and DoInsert when doc is not nil.
func (m *Manager) do(ctx context.Context, id any, doc bson.D, fn func(ctx context.Context, l *Lease) error) (err error) {
	id, raw, err := m.check(ctx, "acquire", id)
	if err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("lease: Do %s: nil function: %w", idText(id), ErrInvalid)
	}
	ctx, ob := m.begin(ctx, opDo, id)
	defer m.end(&ob, &err)
	var l *Lease
	if doc != nil {
		l, err = m.insert(ctx, id, raw, doc, ctx)
	} else {
		l, err = m.acquire(ctx, id, raw, ctx)
	}
	if err != nil {
		return err
	}
	m.acquired(ctx, opDo, l, ob.start)

	kctx, stop := context.WithCancel(ctx)
	var renewing sync.WaitGroup
	renewing.Go(func() { l.KeepAlive(kctx) })

	var fnErr error
	returned := false
	defer func() {
		stop()
		renewing.Wait()
		rctx, cancel := m.detached(ctx)
		relErr := l.Release(rctx)
		cancel()
		if errors.Is(relErr, ErrReleased) {
			relErr = nil // fn released it
		}
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
	ob.aborted = fnErr != nil
	returned = true
	return nil // replaced by the deferred function
}

// KeepAlive renews l every Options.RenewEvery, as Do does for its lease,
// until ctx ends or the lease ends (released, lost or expired). A renewal
// that fails with a transient error (store's classifiers, retry.IsRetryable)
// is retried soon with retry.Do's backoff (Options.Retry's Budget, OnRetry and
// Clock; delays from RenewEvery/20 up to RenewEvery/4) while the lease's local
// deadline allows, so that a few failures in a row do not lose the lease; a
// renewal that finds the lease lost ends it at once. It is for a lease of
// TryAcquire or Acquire: run it in a goroutine of its own, and end ctx (or
// Release the lease) when the lease is no longer needed.
func (l *Lease) KeepAlive(ctx context.Context) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.ctx, cancel)()
	every := l.m.c.RenewEvery
	p := l.m.c.Retry // its Jitter, Rand, Budget, OnRetry, Observer and Clock
	p.InitialInterval, p.MaxInterval, p.Multiplier = max(every/20, time.Millisecond), max(every/4, time.Millisecond), 0
	p.MaxAttempts, p.MaxElapsedTime = -1, -1
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		left := l.TimeLeft()
		if left <= 0 {
			// The deadline timer ends the lease; wait for it (or stop).
			t.Reset(time.Millisecond)
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, left)
		err := retry.Do(rctx, p, func(ctx context.Context) error {
			err := l.Renew(ctx)
			if errors.Is(err, ErrLost) || errors.Is(err, ErrReleased) {
				return retry.Permanent(err)
			}
			return err
		})
		cancel()
		if errors.Is(err, ErrLost) || errors.Is(err, ErrReleased) {
			return
		}
		// Renewed or not in time: the next is due RenewEvery from now.
		t.Reset(every)
	}
}

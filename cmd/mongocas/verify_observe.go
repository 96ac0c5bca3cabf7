package main

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/mongocas/mongocas/observe"
)

// lostReplies counts, through the library's own observer events, the
// replies lost during a verify run and how each was settled: the proof that
// the hard case was exercised, not only survived.
type lostReplies struct {
	seen, landed, resent, notLanded, unknown atomic.Int64
}

// callKey marks a call's context with its callTrack.
type callKey struct{}

// callTrack is what the events of one call said: how many of its replies
// were lost, and the last settlement.
type callTrack struct {
	lost atomic.Int32
	last atomic.Int32 // an observe.Settlement
}

// track returns ctx marked with a fresh callTrack.
func track(ctx context.Context) (context.Context, *callTrack) {
	t := &callTrack{}
	return context.WithValue(ctx, callKey{}, t), t
}

// settledByReread reports whether the call's result came from the re-read
// that found its write landed (and not from a reply).
func (t *callTrack) settledByReread() bool {
	return t.last.Load() == int32(observe.SettledLanded)
}

// Start implements observe.Observer.
func (l *lostReplies) Start(ctx context.Context, _ observe.Event) context.Context { return ctx }

// Observe implements observe.Observer.
func (l *lostReplies) Observe(ctx context.Context, e observe.Event) {
	t, _ := ctx.Value(callKey{}).(*callTrack)
	switch e.Kind {
	case observe.Ambiguous:
		l.seen.Add(1)
		if t != nil {
			t.lost.Add(1)
		}
	case observe.Settled:
		switch e.Settlement {
		case observe.SettledLanded:
			l.landed.Add(1)
		case observe.SettledResent:
			l.resent.Add(1)
		case observe.SettledNotLanded:
			l.notLanded.Add(1)
		case observe.SettledUnknown:
			l.unknown.Add(1)
		}
		if t != nil {
			t.last.Store(int32(e.Settlement))
		}
	default:
	}
}

// settled is how many lost replies were settled (landed, resent or not
// landed).
func (l *lostReplies) settled() int64 { return l.landed.Load() + l.resent.Load() + l.notLanded.Load() }

func (l *lostReplies) String() string {
	return fmt.Sprintf("%d lost replies seen, %d settled (%d landed, %d resent, %d not landed), %d left unknown",
		l.seen.Load(), l.settled(), l.landed.Load(), l.resent.Load(), l.notLanded.Load(), l.unknown.Load())
}

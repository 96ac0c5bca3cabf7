// Package observe_test drives each event of the observe package through a
// real server (the embedded backend, or MONGODB_URI), with the fault proxy
// for lost replies and late copies, and asserts the exact sequence of events
// each operation reports.
package observe_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

// recorder is an Observer that keeps every event, with the operation whose
// context it came with: Start marks the context it returns with the
// operation's name, so that an event of retry.Do or store.ServerClock (which
// carry no Op) shows which operation it ran in.
type recorder struct {
	mu     sync.Mutex
	events []observe.Event
	in     []string // the operation of each event's context, "" if none
}

type opKey struct{}

func (r *recorder) Start(ctx context.Context, e observe.Event) context.Context {
	r.Observe(ctx, e)
	return context.WithValue(ctx, opKey{}, e.Op)
}

func (r *recorder) Observe(ctx context.Context, e observe.Event) {
	in, _ := ctx.Value(opKey{}).(string)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	r.in = append(r.in, in)
}

// reset forgets the events seen so far (those of a test's setup).
func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events, r.in = nil, nil
}

// all returns the events seen so far.
func (r *recorder) all() []observe.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]observe.Event(nil), r.events...)
}

// lines returns the events seen so far, one line each, with the facts a test
// can know exactly (no durations, errors by their class), and checks what
// every event of an operation must carry.
func (r *recorder) lines(t *testing.T, db, coll string) []string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.events))
	for i, e := range r.events {
		if e.Op != "" {
			require.Equal(t, db, e.Database, "event %d (%v)", i, e.Kind)
			require.Equal(t, coll, e.Collection, "event %d (%v)", i, e.Kind)
		}
		if e.Kind != observe.OpStart {
			require.NotEmpty(t, r.in[i], "event %d (%v) came without its operation's context", i, e.Kind)
		}
		out[i] = line(e, r.in[i])
	}
	return out
}

func line(e observe.Event, in string) string {
	s := e.Kind.String()
	if e.Op != "" {
		s += " " + e.Op
	} else {
		s += " in=" + in
	}
	switch e.Kind {
	case observe.OpStart:
		s += fmt.Sprintf(" id=%v", e.ID)
	case observe.OpEnd:
		s += fmt.Sprintf(" id=%v %s", e.ID, e.Outcome)
		if e.Attempt > 0 {
			s += fmt.Sprintf(" attempts=%d", e.Attempt)
		}
	case observe.Conflict:
		s += fmt.Sprintf(" expected=%d current=%d", e.Expected, e.Current)
	case observe.Retry, observe.BudgetRefused:
		s += fmt.Sprintf(" attempt=%d cause=%s", e.Attempt, class(e.Err))
	case observe.Ambiguous:
		s += " cause=" + class(e.Err)
	case observe.Settled:
		s += " " + e.Settlement.String()
	case observe.LeaseAcquired, observe.LeaseRenewed, observe.LeaseRenewFailed, observe.LeaseReleased:
		s += fmt.Sprintf(" epoch=%d owner=%s", e.Epoch, e.Owner)
	case observe.LeaseLost:
		s += fmt.Sprintf(" epoch=%d owner=%s reason=%s holder=%s", e.Epoch, e.Owner, e.Reason, e.Holder)
	case observe.LeaseHeld:
		s += fmt.Sprintf(" holder=%s epoch=%d", e.Holder, e.Epoch)
	default:
	}
	return s
}

// class names the kind of an event's error.
func class(err error) string {
	switch {
	case err == nil:
		return "none"
	case errors.Is(err, versioned.ErrConflict):
		return "conflict"
	case errors.Is(err, lease.ErrHeld):
		return "held"
	case store.IsNetwork(err):
		return "network"
	}
	return fmt.Sprintf("%T", err)
}

// requireLines compares the sequence of events with want, line by line.
func requireLines(t *testing.T, want, got []string) {
	t.Helper()
	require.Equal(t, strings.Join(want, "\n"), strings.Join(got, "\n"))
}

package lease

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
	"weak"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/store"
)

// Lines: Acquire and Do calls for one lease in one process wait in line;
// one claims at a time (see DESIGN.md, "Waiting in line").

// lineKey names the leases of one collection and lease field of a client.
type lineKey struct {
	client          weak.Pointer[mongo.Client]
	db, coll, field string
}

// leaseLineSets is the process's registry of lines.
var leaseLineSets struct {
	mu sync.Mutex
	m  map[lineKey]*lines
}

// lines holds the lines of the leases of one collection and field that
// have calls waiting, claiming or holding.
type lines struct {
	mu  sync.Mutex
	ids map[string]*line
}

// line is the calls for one lease: the one whose turn it is (claiming or
// holding), and those waiting, in order; it exists while a call has the turn.
type line struct {
	claim   *lineWaiter   // the call claiming now, to wake when another lease of the id ends
	holder  *Lease        // the lease the line's call holds, nil while it claims
	waiting []*lineWaiter // FIFO
}

// lineWaiter is a call in a line.
type lineWaiter struct {
	wake chan struct{} // 1-buffered: its turn came, or (while it claims) a lease of the id ended
	turn bool
}

func (w *lineWaiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// linesOf returns the lines of coll's leases in field, shared by every
// Manager on them through the same client.
func linesOf(coll *mongo.Collection, field string) *lines {
	client := coll.Database().Client()
	k := lineKey{client: weak.Make(client), db: coll.Database().Name(), coll: coll.Name(), field: field}
	leaseLineSets.mu.Lock()
	defer leaseLineSets.mu.Unlock()
	if ls := leaseLineSets.m[k]; ls != nil {
		return ls
	}
	if leaseLineSets.m == nil {
		leaseLineSets.m = map[lineKey]*lines{}
	}
	ls := &lines{ids: map[string]*line{}}
	leaseLineSets.m[k] = ls
	runtime.AddCleanup(client, func(k lineKey) {
		leaseLineSets.mu.Lock()
		delete(leaseLineSets.m, k)
		leaseLineSets.mu.Unlock()
	}, k)
	return ls
}

// lineID is the key of a lease's line: its id's encoding and its shard-key
// values (none without a shard key).
func lineID(raw docKey) string {
	return string(rune(raw.ID.Type)) + string(raw.ID.Value) + "\x00" + raw.Shard.Ident()
}

// join puts w in the line of k and reports whether its turn has come.
func (ls *lines) join(k string, w *lineWaiter) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.ids[k]; l != nil {
		l.waiting = append(l.waiting, w)
		return false
	}
	ls.ids[k], w.turn = &line{claim: w}, true
	return true
}

// leave takes w out of the line of k, if its turn has not come, and reports
// whether it did.
func (ls *lines) leave(k string, w *lineWaiter) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if w.turn {
		return false
	}
	l := ls.ids[k]
	for i, x := range l.waiting {
		if x == w {
			l.waiting = append(l.waiting[:i], l.waiting[i+1:]...)
			break
		}
	}
	return true
}

// hold records that the line's call holds l. If l has ended meanwhile, the
// turn passes at once.
func (ls *lines) hold(k string, l *Lease) {
	ls.mu.Lock()
	ls.ids[k].holder, ls.ids[k].claim = l, nil
	ls.mu.Unlock()
	if l.Err() != nil {
		ls.ended(k, l)
	}
}

// ended is called when lease l of k ends, or with nil when the line's call
// failed to claim. If l was the line's, the turn passes to the next call in
// line, or the line is removed when nobody waits; otherwise (a lease from
// TryAcquire) the call claiming now is woken to try at once.
func (ls *lines) ended(k string, l *Lease) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	line := ls.ids[k]
	switch {
	case line == nil:
	case line.holder != l:
		if line.claim != nil {
			line.claim.signal()
		}
	case len(line.waiting) == 0:
		delete(ls.ids, k)
	default:
		line.holder, line.claim, line.waiting = nil, line.waiting[0], line.waiting[1:]
		line.claim.turn = true
		line.claim.signal()
	}
}

// acquire claims the lease on id for Acquire and Do: it waits for its turn
// in the line of id, then claims, waiting while another process holds the
// lease (see claimWaiting), and keeps the turn until the lease it got ends.
func (m *Manager) acquire(ctx context.Context, id any, raw docKey, parent context.Context) (*Lease, error) {
	if m.c.Retry.MaxAttempts == 1 {
		// One attempt, no wait (Options.Retry), not even in line: a lease
		// held in this process is held as one held elsewhere.
		return m.claimWaiting(ctx, id, raw, parent, nil)
	}
	k := lineID(raw)
	w := &lineWaiter{wake: make(chan struct{}, 1)}
	if !m.lines.join(k, w) {
		select {
		case <-w.wake:
		case <-ctx.Done():
			if m.lines.leave(k, w) {
				return nil, fmt.Errorf("lease: acquire %v: %w (waiting in line)", idText(id), store.ContextError(ctx))
			}
			<-w.wake // the turn came meanwhile: take it, and claim (or fail) below
		}
		drain(w.wake)
	}
	l, err := m.claimWaiting(ctx, id, raw, parent, w.wake)
	if err != nil {
		m.lines.ended(k, nil) // the turn passes
		return nil, err
	}
	m.lines.hold(k, l)
	return l, nil
}

// drain empties a 1-buffered wake channel.
func drain(c chan struct{}) {
	select {
	case <-c:
	default:
	}
}

// wakeClock is a store.Clock whose timers last *sleep, when set, instead of
// the backoff delay, and fire early when wake is signalled.
type wakeClock struct {
	base  store.Clock
	sleep *time.Duration
	wake  <-chan struct{}
}

func (c wakeClock) Now() time.Time { return c.base.Now() }

func (c wakeClock) NewTimer(d time.Duration) store.Timer {
	if *c.sleep > 0 {
		d = *c.sleep
	}
	t := c.base.NewTimer(d)
	if c.wake == nil {
		return t
	}
	stopped, stop := context.WithCancel(context.Background())
	wt := &wakeTimer{Timer: t, c: make(chan time.Time, 1), stop: stop}
	go func() {
		select {
		case v := <-t.C():
			wt.c <- v
		case <-c.wake:
			t.Stop()
			wt.c <- c.base.Now()
		case <-stopped.Done():
		}
	}()
	return wt
}

// wakeTimer is a timer that also fires on a wake.
type wakeTimer struct {
	store.Timer
	c    chan time.Time
	stop context.CancelFunc
}

func (t *wakeTimer) C() <-chan time.Time { return t.c }

func (t *wakeTimer) Stop() bool {
	t.stop()
	return t.Timer.Stop()
}

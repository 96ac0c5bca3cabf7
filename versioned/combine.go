package versioned

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"weak"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// maxBatch bounds the calls one write combines: at most half of the
// [WriteIDs] window per write, so the ids of the write before it stay listed.
const maxBatch = WriteIDs / 2

// collKey names a collection of a client (held weakly), the unit whose
// Modify calls share lines (DESIGN.md, "Combining").
type collKey struct {
	client   weak.Pointer[mongo.Client]
	db, coll string
}

// lines is the process's registry of lines, per collection.
var lines struct {
	mu sync.Mutex
	m  map[collKey]*collLines
}

// collLines holds the lines of the documents of one collection that have
// calls waiting or in progress.
type collLines struct {
	mu    sync.Mutex
	docs  map[cacheID]*line
	gates map[cacheID]*gate // Guarded's, per document with calls in flight
	// noPipes says that the server refused an update pipeline for Modify's
	// writes, or ran one wrongly (see usePipelines).
	noPipes atomic.Bool
}

// line is the calls on one document: those waiting (the head is the next
// leader once promoted) and whether a leader is at work.
type line struct {
	waiting []*waiter
	busy    bool // a batch is running, or the head was promoted to lead one
}

// wstate is where a call stands in its line.
type wstate uint8

const (
	wQueued  wstate = iota // waiting, not in a batch
	wLeading               // at the head of the line, promoted to lead the next batch
	wTaken                 // in a batch, its fn not started in this attempt (or between attempts): it may leave
	wBusy                  // in a batch, its fn started in this attempt (fn may be running or its change in flight), or the attempt is being reported
	wDone                  // settled, or withdrawn because its context ended
)

// waiter is a call in a line. Its fields are guarded by the collLines'
// mutex.
type waiter struct {
	class any           // calls of one class combine; nil never combines
	self  any           // the call (a *member[T])
	wake  chan struct{} // 1-buffered: the state changed
	state wstate
	// withdrawn: the call's context ended in a batch before its fn started
	// in the attempt; it returned, and the batch drops it.
	withdrawn bool
}

// signal wakes the waiter's goroutine to look at its state. A waiter that
// led at once has no wake channel: its own goroutine runs the batch.
func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default: // a wake is pending already
	}
}

// linesOf returns the lines of coll's collection, shared by every Repo on
// it through the same client.
func linesOf(coll *mongo.Collection) *collLines {
	client := coll.Database().Client()
	k := collKey{client: weak.Make(client), db: coll.Database().Name(), coll: coll.Name()}
	lines.mu.Lock()
	defer lines.mu.Unlock()
	if l := lines.m[k]; l != nil {
		return l
	}
	if lines.m == nil {
		lines.m = map[collKey]*collLines{}
	}
	l := &collLines{docs: map[cacheID]*line{}, gates: map[cacheID]*gate{}}
	lines.m[k] = l
	runtime.AddCleanup(client, func(k collKey) {
		lines.mu.Lock()
		delete(lines.m, k)
		lines.mu.Unlock()
	}, k)
	return l
}

// enqueue puts w at the end of document dk's line and reports whether it
// leads at once (nobody else is at work on the document).
func (c *collLines) enqueue(dk cacheID, w *waiter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.docs[dk]
	if l == nil {
		l = &line{}
		c.docs[dk] = l
	}
	l.waiting = append(l.waiting, w)
	if !l.busy {
		l.busy = true
		w.state = wLeading
		return true
	}
	w.state = wQueued
	if w.wake == nil {
		w.wake = make(chan struct{}, 1)
	}
	return false
}

// state returns w's state.
func (c *collLines) state(w *waiter) wstate {
	c.mu.Lock()
	defer c.mu.Unlock()
	return w.state
}

// take removes the batch lead forms from the head of dk's line: lead, which
// is at the head, and the waiters right behind it of its class, at most max
// in all. They are then taken. It appends them to batch.
func (c *collLines) take(dk cacheID, lead *waiter, limit int, batch []*waiter) []*waiter {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.docs[dk]
	n := 1
	if lead.class != nil {
		for n < len(l.waiting) && n < limit && l.waiting[n].class == lead.class {
			n++
		}
	}
	batch = append(batch, l.waiting[:n]...)
	clear(l.waiting[:n])
	l.waiting = l.waiting[n:]
	for _, w := range batch {
		w.state = wTaken
	}
	return batch
}

// withdraw takes w out of its line or batch because its context ended, if
// its fn has not started in the current attempt, and reports whether it did
// (the call then returns its context's error: nothing of it was written).
func (c *collLines) withdraw(dk cacheID, w *waiter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch w.state {
	case wQueued, wLeading:
		l := c.docs[dk]
		for i, x := range l.waiting {
			if x == w {
				l.waiting = append(l.waiting[:i], l.waiting[i+1:]...)
				break
			}
		}
		if w.state == wLeading {
			c.promote(dk, l)
		}
	case wTaken:
		w.withdrawn = true
	default: // in flight, or settled
		return false
	}
	w.state = wDone
	return true
}

// settle marks w settled (its result is set) and wakes its goroutine. It
// reports false, settling nothing, if w withdrew first.
func (c *collLines) settle(w *waiter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.withdrawn || w.state == wDone {
		return false
	}
	w.state = wDone
	w.signal()
	return true
}

// release ends a batch on dk: the waiters in rest, which it did not settle,
// go back to the head of the line, in their order, and the head is promoted
// to lead the next batch (promote).
func (c *collLines) release(dk cacheID, rest []*waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.docs[dk]
	if len(rest) > 0 {
		back := make([]*waiter, 0, len(rest)+len(l.waiting))
		for _, w := range rest {
			if !w.withdrawn && w.state != wDone {
				w.state = wQueued
				if w.wake == nil {
					w.wake = make(chan struct{}, 1)
				}
				back = append(back, w)
			}
		}
		l.waiting = append(back, l.waiting...)
	}
	c.promote(dk, l)
}

// promote hands the line of dk to its head, or removes the line when nobody
// waits. c.mu must be held.
func (c *collLines) promote(dk cacheID, l *line) {
	if len(l.waiting) == 0 {
		l.busy = false
		delete(c.docs, dk)
		return
	}
	h := l.waiting[0]
	h.state = wLeading
	h.signal()
}

// guardedSlots bounds the Guarded writes to one document that one client
// has in flight: 4 processes at this bound have at most WriteIDs in flight,
// so a busy document seldom pushes an anchor out of the window.
const guardedSlots = WriteIDs / 4

// gate is the slots of one document's Guarded writes.
type gate struct {
	slots chan struct{}
	users int // calls holding or waiting for a slot, guarded by the collLines' mutex
}

var gates = sync.Pool{New: func() any { return &gate{slots: make(chan struct{}, guardedSlots)} }}

// enter waits for one of document dk's Guarded slots, which the caller
// frees with exit; or returns the context's error, having taken none.
func (c *collLines) enter(ctx context.Context, dk cacheID) (*gate, error) {
	c.mu.Lock()
	g := c.gates[dk]
	if g == nil {
		g = gates.Get().(*gate) //nolint:forcetypeassert // the pool's own type
		c.gates[dk] = g
	}
	g.users++
	c.mu.Unlock()
	select {
	case g.slots <- struct{}{}:
		return g, nil
	case <-ctx.Done():
		c.exit(dk, g, false)
		return nil, ctx.Err()
	}
}

// exit leaves document dk's gate g, freeing the slot it held if held.
func (c *collLines) exit(dk cacheID, g *gate, held bool) {
	if held {
		<-g.slots
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.users--; g.users == 0 {
		delete(c.gates, dk)
		gates.Put(g)
	}
}

package idempotency

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/store"
)

// MaxCheckpointNameLen is the longest checkpoint or step name accepted, in
// bytes.
const MaxCheckpointNameLen = 100

// Call is one run of a request under the claim of its key: what Func gets,
// with the checkpoints of every run of the key so far. It is safe for
// concurrent use, and valid only while its Func runs.
type Call struct {
	k       *Keys
	ref     keyRef
	l       *lease.Lease
	rid     bson.ObjectID
	attempt int

	mu     sync.Mutex
	points []point
	names  map[string]chan struct{} // a one-slot semaphore per name in use
}

// Key returns the idempotency key.
func (c *Call) Key() string { return c.ref.key }

// Scope returns the key's scope ("" by default).
func (c *Call) Scope() string { return c.ref.scope }

// Epoch returns the claim's epoch: a fencing token that every later claim of
// the key exceeds (see lease.Lease.Epoch). It names this run only: for a
// partner's idempotency key, use Step's, the same across the runs.
func (c *Call) Epoch() int64 { return c.l.Epoch() }

// Attempt returns which run of the key this is: 1 for the first, 2 after
// one claim ended without a result (an error, or a crash), and so on.
func (c *Call) Attempt() int { return c.attempt }

// Last returns the name of the last checkpoint recorded for the key by any
// run, or "" if there is none: where a run resumes.
func (c *Call) Last() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range slices.Backward(c.points) {
		if p.K[0] == 'c' {
			return p.Name
		}
	}
	return ""
}

// Reached reports whether the checkpoint name was recorded for the key by
// any run, and returns the data recorded with it.
func (c *Call) Reached(name string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.find("c:" + name); p != nil {
		return p.Data, true
	}
	return nil, false
}

// find returns the point with key k, or nil. c.mu is held.
func (c *Call) find(k string) *point {
	if i := slices.IndexFunc(c.points, func(p point) bool { return p.K == k }); i >= 0 {
		return &c.points[i]
	}
	return nil
}

// fail is the error of op on the checkpoint or step name.
func (c *Call) fail(op, name string, err error) error {
	return fmt.Errorf("idempotency: key %s: %s %q: %w", quoteKey(c.ref.key), op, name, err)
}

// enter checks ctx and name, then waits until no other Step or Checkpoint
// of name runs in this Call, and returns the function that lets one run.
func (c *Call) enter(ctx context.Context, op, name string) (unlock func(), err error) {
	if err := store.CheckContext(ctx); err != nil {
		return nil, c.fail(op, name, err)
	}
	switch {
	case name == "":
		return nil, c.fail(op, name, fmt.Errorf("empty name: %w", ErrInvalid))
	case len(name) > MaxCheckpointNameLen:
		return nil, c.fail(op, name, fmt.Errorf("name longer than 100 bytes: %w", ErrInvalid))
	case !utf8.ValidString(name):
		return nil, c.fail(op, name, fmt.Errorf("name is not valid UTF-8: %w", ErrInvalid))
	}
	c.mu.Lock()
	sem := c.names[name]
	if sem == nil {
		sem = make(chan struct{}, 1)
		c.names[name] = sem
	}
	c.mu.Unlock()
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, c.fail(op, name, store.ContextError(ctx))
	}
}

// Checkpoint records a recovery point: the work up to here is done, and a
// retry resumes after it (Reached reports it, with data). It is one update
// of the key record, fenced on the claim: if a later claim took the key
// over, nothing is written, the error matches ErrLost, and this run must
// stop. Recording a name twice (also from two goroutines at once: one
// records it), an empty name, and one longer than MaxCheckpointNameLen or
// not UTF-8 are errors matching ErrInvalid. Concurrent checkpoints have no
// order between them. A lost reply is settled by re-reading the record.
func (c *Call) Checkpoint(ctx context.Context, name string, data []byte) error {
	unlock, err := c.enter(ctx, "checkpoint", name)
	if err != nil {
		return err
	}
	defer unlock()
	return c.checkpoint(ctx, name, data)
}

// checkpoint is Checkpoint with the name's lock held.
func (c *Call) checkpoint(ctx context.Context, name string, data []byte) error {
	return c.record(ctx, "checkpoint", point{K: "c:" + name, Name: name, Data: data, Epoch: c.l.Epoch(), W: bson.NewObjectID()})
}

// Step runs fn once for the step name across every run of the key: if a
// checkpoint of that name was recorded, it returns its data without calling
// fn; otherwise it records that the step began (once, fenced like
// Checkpoint), calls fn, and records fn's data as the checkpoint name.
//
// fn gets partnerKey, an idempotency key for the partner it calls: the same
// in every run that resumes the step, and different between steps and
// records. If fn fails, nothing is recorded and Step returns fn's error: a
// retry calls fn again, with the same key.
//
// Steps of one name in one Call run one at a time: a second waits for the
// first, then returns its data (or calls fn, if the first's failed). fn
// must not call Step or Checkpoint of its own name.
func (c *Call) Step(ctx context.Context, name string, fn func(ctx context.Context, partnerKey string) ([]byte, error)) ([]byte, error) {
	if fn == nil {
		return nil, c.fail("step", name, fmt.Errorf("nil function: %w", ErrInvalid))
	}
	unlock, err := c.enter(ctx, "step", name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if data, ok := c.Reached(name); ok {
		return data, nil
	}
	c.mu.Lock()
	var start point
	if began := c.find("b:" + name); began != nil {
		start = *began
	}
	c.mu.Unlock()
	if start.K == "" {
		start = point{K: "b:" + name, Name: name, Epoch: c.l.Epoch(), W: bson.NewObjectID()}
		if err := c.record(ctx, "step", start); err != nil {
			return nil, err
		}
	}
	data, err := fn(ctx, c.rid.Hex()+"-"+start.W.Hex())
	if err != nil {
		return nil, err
	}
	return data, c.checkpoint(ctx, name, data)
}

// record appends p to the record's points, fenced on the claim.
func (c *Call) record(ctx context.Context, op string, p point) error {
	c.mu.Lock()
	if c.find(p.K) != nil {
		c.mu.Unlock()
		return c.fail(op, p.Name, fmt.Errorf("already recorded: %w", ErrInvalid))
	}
	c.mu.Unlock()
	now, err := c.k.estimate(ctx)
	if err != nil {
		return c.fail(op, p.Name, err)
	}
	update := bson.D{
		{Key: "$push", Value: bson.D{{Key: "points", Value: p}}},
		{Key: "$set", Value: bson.D{{Key: "expireAt", Value: now.Add(c.k.c.retention)}}},
	}
	send := func(ctx context.Context) (record, bool, error) {
		// The $ne makes a second copy of the write change nothing.
		filter := append(fenced(c.ref.id, c.l), bson.E{Key: "points.k", Value: bson.D{{Key: "$ne", Value: p.K}}})
		res, err := c.k.coll.UpdateOne(ctx, filter, update)
		return record{}, err == nil && res.MatchedCount == 1, err
	}
	// Landed only if the point carries this write's id (DESIGN.md).
	dup := false
	landed := func(rec record) (bool, bool) {
		for _, q := range rec.Points {
			if q.K == p.K {
				dup = q.W != p.W && q.Epoch == p.Epoch
				return q.W == p.W, q.W != p.W
			}
		}
		return false, false
	}
	rec, err := c.k.fencedWrite(ctx, op+" "+strconv.Quote(p.Name), c.ref, c.l, send, landed)
	if err != nil {
		if dup {
			return c.fail(op, p.Name, fmt.Errorf("already recorded by another call of this run: %w", ErrInvalid))
		}
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Merged: points of this run that landed after a re-read are kept.
	for _, q := range rec.Points {
		if c.find(q.K) == nil {
			c.points = append(c.points, q)
		}
	}
	if c.find(p.K) == nil {
		c.points = append(c.points, p)
	}
	return nil
}

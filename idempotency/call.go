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

// Call is one run of a request under the claim of its key: what Func gets.
// It carries the claim's epoch and the checkpoints recorded by every run of
// the key so far, and records new ones. A Call is safe for concurrent use;
// it is valid only while its Func runs.
type Call struct {
	k       *Keys
	ref     keyRef
	l       *lease.Lease
	rid     bson.ObjectID
	attempt int

	mu     sync.Mutex
	points []point
}

// Key returns the idempotency key.
func (c *Call) Key() string { return c.ref.key }

// Scope returns the key's scope ("" by default).
func (c *Call) Scope() string { return c.ref.scope }

// Epoch returns the claim's epoch: a fencing token that every later claim of
// the key exceeds (see lease.Lease.Epoch). Every checkpoint is fenced on it.
// Pass it to a partner that can reject requests older than the last one it
// saw. As an idempotency key for the partner it names this run only: a
// retry after a crash runs with a larger epoch; use Step, whose partner key
// stays the same across the runs that resume the step.
func (c *Call) Epoch() int64 { return c.l.Epoch() }

// Attempt returns which run of the key this is: 1 for the first claim that
// ran it, 2 after one claim ended without a result (an error, or a crash),
// and so on.
func (c *Call) Attempt() int { return c.attempt }

// Last returns the name of the last checkpoint recorded for the key, by this
// run or an earlier one, or "" if there is none: where a run resumes.
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

// Reached reports whether the checkpoint name was recorded for the key,
// by this run or an earlier one, and returns the data recorded with it.
func (c *Call) Reached(name string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, p := c.find("c:" + name); p != nil {
		return p.Data, true
	}
	return nil, false
}

// find returns the index of the point with key k and the point, or -1 and
// nil. c.mu is held.
func (c *Call) find(k string) (int, *point) {
	for i := range c.points {
		if c.points[i].K == k {
			return i, &c.points[i]
		}
	}
	return -1, nil
}

// Checkpoint records a recovery point: the work up to here is done and must
// not be redone by a retry, which resumes after it (Reached reports it, with
// data: the ids and facts the rest of the work needs). Stripe calls these
// atomic phases' recovery points. It is one update of the key record, fenced
// on the claim: if a later claim took the key over (this run's claim
// expired), nothing is written and the error matches ErrLost, and this run
// must stop. Recording a name twice is an error matching ErrInvalid, as are
// an empty name and one longer than MaxCheckpointNameLen or not UTF-8.
// An ambiguous failure is settled by re-reading the record.
func (c *Call) Checkpoint(ctx context.Context, name string, data []byte) error {
	_, err := c.record(ctx, "checkpoint", point{K: "c:" + name, Name: name, Data: data, Epoch: c.l.Epoch()})
	return err
}

// Step runs fn once for the step name across every run of the key: if a
// checkpoint of that name was recorded, it returns its data without calling
// fn; otherwise it records that the step began (once, fenced like
// Checkpoint), calls fn, and records fn's data as the checkpoint name.
//
// fn gets partnerKey, an idempotency key for the partner it calls: the
// record's id, the step's position and the epoch of the claim that began
// the step. It is the same in every run that resumes the step, so when a
// run died after the partner acted and before the checkpoint, the retry's
// call is recognised by the partner as the same one (Stripe passes its own
// key record's id the same way). If fn fails, no checkpoint is recorded and
// Step returns fn's error: a retry calls fn again, with the same key.
func (c *Call) Step(ctx context.Context, name string, fn func(ctx context.Context, partnerKey string) ([]byte, error)) ([]byte, error) {
	if fn == nil {
		return nil, fmt.Errorf("idempotency: key %s: step %q: nil function: %w", quoteKey(c.ref.key), name, ErrInvalid)
	}
	if data, ok := c.Reached(name); ok {
		return data, nil
	}
	c.mu.Lock()
	i, began := c.find("b:" + name)
	var start point
	if began != nil {
		start = *began
	}
	c.mu.Unlock()
	if began == nil {
		var err error
		if i, err = c.record(ctx, "step", point{K: "b:" + name, Name: name, Epoch: c.l.Epoch()}); err != nil {
			return nil, err
		}
		start = point{Epoch: c.l.Epoch()}
	}
	partnerKey := c.rid.Hex() + "-" + strconv.Itoa(i) + "-" + strconv.FormatInt(start.Epoch, 10)
	data, err := fn(ctx, partnerKey)
	if err != nil {
		return nil, err
	}
	if err := c.Checkpoint(ctx, name, data); err != nil {
		return data, err
	}
	return data, nil
}

// record appends p to the record's points, fenced on the claim, and
// returns its index.
func (c *Call) record(ctx context.Context, op string, p point) (int, error) {
	if err := store.CheckContext(ctx); err != nil {
		return 0, fmt.Errorf("idempotency: key %s: %s %q: %w", quoteKey(c.ref.key), op, p.Name, err)
	}
	if err := checkName(p.Name); err != "" {
		return 0, fmt.Errorf("idempotency: key %s: %s %q: %s: %w", quoteKey(c.ref.key), op, p.Name, err, ErrInvalid)
	}
	c.mu.Lock()
	if _, q := c.find(p.K); q != nil {
		c.mu.Unlock()
		return 0, fmt.Errorf("idempotency: key %s: %s %q: already recorded: %w", quoteKey(c.ref.key), op, p.Name, ErrInvalid)
	}
	c.mu.Unlock()
	now, err := c.k.estimate(ctx)
	if err != nil {
		return 0, fmt.Errorf("idempotency: key %s: %s %q: %w", quoteKey(c.ref.key), op, p.Name, err)
	}
	update := bson.D{
		{Key: "$push", Value: bson.D{{Key: "points", Value: p}}},
		{Key: "$set", Value: bson.D{{Key: "expireAt", Value: now.Add(c.k.c.retention)}}},
	}
	send := func(ctx context.Context) (bool, record, error) {
		// The $ne makes a second copy of the write change nothing.
		filter := append(fenced(c.ref.id, c.l), bson.E{Key: "points.k", Value: bson.D{{Key: "$ne", Value: p.K}}})
		res, err := c.k.coll.UpdateOne(ctx, filter, update)
		if err != nil {
			return false, record{}, err
		}
		return res.MatchedCount == 1, record{}, nil
	}
	landed := func(rec record) (bool, bool) {
		for _, q := range rec.Points {
			if q.K == p.K {
				return q.Epoch == p.Epoch, q.Epoch != p.Epoch
			}
		}
		return false, false
	}
	rec, err := c.k.fencedWrite(ctx, op+" "+strconv.Quote(p.Name), c.ref, c.l, send, landed)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if rec.Points != nil {
		c.points = rec.Points // settled by a re-read: the record is the truth
	} else {
		c.points = append(c.points, p)
	}
	i, _ := c.find(p.K)
	return i, nil
}

func checkName(name string) string {
	switch {
	case name == "":
		return "empty name"
	case len(name) > MaxCheckpointNameLen:
		return "name longer than 100 bytes"
	case !utf8.ValidString(name):
		return "name is not valid UTF-8"
	}
	return ""
}

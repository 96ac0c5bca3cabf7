package move

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// Status returns where the move id, whose source is from, stands: Pending
// while its entry is in the source, then Done or Returned. It reads the
// source at read concern majority, then the outcomes collection. A move
// that neither knows is ErrNotFound: a debit that has not landed, or an
// outcome record deleted since. After Move returned an unknown outcome,
// ErrNotFound is not final: a copy of the debit still in the network may
// land later, so do not send a new Move for the same intent on its
// strength; make the intent idempotent instead (package idempotency).
func (m *Mover) Status(ctx context.Context, from any, id bson.ObjectID) (Status, error) {
	if err := store.CheckContext(ctx); err != nil {
		return "", err
	}
	src, err := store.CheckID(from)
	if err != nil {
		return "", invalid("status", "from", "", err)
	}
	if id.IsZero() {
		return "", invalid("status", "id", "the zero ObjectID", nil)
	}
	doc, err := m.readRaw(ctx, src)
	if err != nil {
		return "", fmt.Errorf("move: status %s: %w", id.Hex(), err)
	}
	if doc != nil {
		if _, ok := m.entry(doc, "o", id); ok {
			return Pending, nil
		}
		if d, ok := m.entry(doc, "d", id); ok {
			if s, ok := outcomeIn(d); ok {
				return Status(s), nil
			}
		}
	}
	var rec struct {
		Outcome string `bson:"outcome"`
	}
	err = m.outcomes.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&rec)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return "", fmt.Errorf("move: status %s: %w", id.Hex(), ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("move: status %s: %w", id.Hex(), err)
	}
	return Status(rec.Outcome), nil
}

// Sweep enqueues a relay job for every move whose state has been waiting
// longer than Options.Grace and that has no unfinished job (available,
// running or retryable): a pending entry whose process died before it
// enqueued (or whose enqueue failed, or whose job died), an outcome not yet
// recorded, a marker not yet removed. One job per move, however many of
// its records it finds, so a relay that is behind is not handed more of
// the same work on each run. A move can still get a second job (two
// processes sweeping at once, a Move whose own enqueue took longer than
// Grace), or a job after its first finished between the scan and the read
// of the queue; either is harmless (DESIGN.md). It reads the queue's unfinished
// jobs only when it found such a move. It returns how many jobs it
// enqueued. Run it periodically in at least one process.
func (m *Mover) Sweep(ctx context.Context) (int, error) {
	if err := store.CheckContext(ctx); err != nil {
		return 0, err
	}
	old := time.Now().Add(-m.grace)
	var due []relayArgs
	seen := map[bson.ObjectID]bool{}
	err := scan(ctx, m.coll, m.state, func(e Entry) error {
		if !e.At.After(old) && !seen[e.Move] {
			seen[e.Move] = true
			due = append(due, relayArgs{M: e.Move, From: e.From, To: e.To, V: e.Amount})
		}
		return nil
	})
	if err != nil || len(due) == 0 {
		return 0, wrap("sweep", err)
	}
	queued := map[bson.ObjectID]bool{} // moves with an unfinished job
	err = m.relay.Unfinished(ctx, func(_ bson.ObjectID, a relayArgs) error {
		queued[a.M] = true
		return nil
	})
	if err != nil {
		return 0, wrap("sweep", err)
	}
	n := 0
	for _, a := range due {
		if queued[a.M] {
			continue
		}
		if _, err := m.relay.Enqueue(ctx, a.To, a); err != nil {
			return n, wrap("sweep", err)
		}
		n++
	}
	return n, nil
}

// wrap prefixes a non-nil err with the package and the operation.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("move: %s: %w", op, err)
}

// Stage says which of a move's records an Entry is (DESIGN.md).
type Stage string

// The stages of an Entry.
const (
	// StagePending: the move's pending entry on its source. Its Amount
	// left the source and is credited to neither end yet, as far as the
	// source knows: the move is Pending.
	StagePending Stage = "pending"
	// StageOutcome: the move is settled (Outcome says how), and its outcome
	// is on the source until the outcomes collection records it.
	StageOutcome Stage = "outcome"
	// StageMarker: the target's marker of the move (Outcome Done: the
	// credit applied; Returned: it never will; Pending: a MoveAll's target
	// admits the credit, not applied yet), until the move's outcome is
	// recorded and the source has neither a pending entry nor an outcome
	// of it (a marker whose source was deleted mid-move stays: package doc).
	StageMarker Stage = "marker"
)

// Entry is one record of an unsettled or not yet cleaned-up move, as a
// document holds it.
type Entry struct {
	// Move is the move's id (Status takes it).
	Move bson.ObjectID
	// Doc is the id of the document that holds the entry: From for
	// StagePending and StageOutcome, To for StageMarker.
	Doc bson.RawValue
	// Stage says which record this is.
	Stage Stage
	// From and To are the move's ends; Amount its value.
	From, To bson.RawValue
	Amount   int64
	// Outcome is Done or Returned for StageOutcome and StageMarker (Pending
	// for a MoveAll's prepared marker), empty for StagePending.
	Outcome Status
	// At is when the record was written, by the writing process's clock.
	At time.Time
}

// Unsettled returns the records of moves kept in the documents of coll
// under stateField ("" for DefaultStateField): every pending entry (value
// in flight) and every outcome and marker not yet cleaned up, oldest first,
// at most limit of them (0: all). It reads, with coll's read concern, only
// the documents that hold such records (through the index New makes), and
// needs no Mover: an operator's tool can call it (mongocas moves). A
// pending entry older than Options.Grace that Sweep has run past belongs
// to a move whose relay is behind or failing: look at the queue's
// unfinished and dead jobs.
func Unsettled(ctx context.Context, coll *mongo.Collection, stateField string, limit int) ([]Entry, error) {
	if err := store.CheckContext(ctx); err != nil {
		return nil, err
	}
	if coll == nil {
		return nil, invalid("unsettled", "coll", "nil collection", nil)
	}
	stateField = cmp.Or(stateField, DefaultStateField)
	if err := checkField(stateField); err != nil {
		return nil, invalid("unsettled", "stateField", err.Error(), nil)
	}
	if limit < 0 {
		return nil, invalid("unsettled", "limit", fmt.Sprintf("%d is negative", limit), nil)
	}
	var out []Entry
	err := scan(ctx, coll, stateField, func(e Entry) error {
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("move: unsettled: %w", err)
	}
	slices.SortStableFunc(out, func(a, b Entry) int { return a.At.Compare(b.At) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// scan calls fn for every record of a move held under state in the
// documents of coll (those whose count state.n is positive).
func scan(ctx context.Context, coll *mongo.Collection, state string, fn func(Entry) error) error {
	cur, err := coll.Find(ctx, bson.D{{Key: state + ".n", Value: bson.D{{Key: "$gt", Value: 0}}}},
		options.Find().SetProjection(bson.D{{Key: state, Value: 1}}))
	if err != nil {
		return err
	}
	defer cur.Close(ctx)
	for cur.Next(ctx) {
		id := cur.Current.Lookup("_id")
		for _, part := range []string{"o", "d", "i"} {
			entries, ok := cur.Current.Lookup(state, part).DocumentOK()
			if !ok {
				continue
			}
			elems, err := entries.Elements()
			if err != nil {
				return err
			}
			for _, el := range elems {
				e, ok := entryOf(id, part, el)
				if !ok {
					continue
				}
				if err := fn(e); err != nil {
					return err
				}
			}
		}
	}
	return cur.Err()
}

// entryOf reads an element of part ("o", "d", "i") of the document id's
// state: its key is the move's id, its value says the other end.
func entryOf(id bson.RawValue, part string, el bson.RawElement) (Entry, bool) {
	mid, err := bson.ObjectIDFromHex(el.Key())
	if err != nil {
		return Entry{}, false
	}
	d, ok := el.Value().DocumentOK()
	if !ok {
		return Entry{}, false
	}
	e := Entry{Move: mid, Doc: id}
	e.At, _ = d.Lookup("at").TimeOK()
	e.Amount, _ = d.Lookup("v").AsInt64OK()
	switch part {
	case "o":
		e.Stage, e.From, e.To = StagePending, id, d.Lookup("to")
	case "d":
		e.Stage, e.From, e.To = StageOutcome, id, d.Lookup("to")
		s, _ := d.Lookup("s").StringValueOK()
		e.Outcome = Status(s)
	default:
		e.Stage, e.From, e.To, e.Outcome = StageMarker, d.Lookup("from"), id, Done
		switch {
		case d.Lookup("r").Type != 0:
			e.Outcome = Returned
		case d.Lookup("p").Type != 0:
			e.Outcome = Pending // a saga's target prepared, not credited
		}
	}
	return e, e.To.Type != 0 && e.From.Type != 0
}

// Total is what Sum read.
type Total struct {
	// Sum is the values of the documents plus their pending entries that
	// no document read has credited yet: constant over time for a set of
	// documents closed under the moves among them.
	Sum int64
	// Values is the sum of the values alone.
	Values int64
	// Pending is the number of pending entries counted in Sum.
	Pending int
	// Reads is how many times the documents were read.
	Reads int
}

// Sum reads the documents ids at read concern majority and returns the sum
// of their values plus their pending moves (those not yet credited to a
// document of the set). A read of many documents is not a snapshot: Sum
// reads them again until two reads in a row find every document at the
// same version (so each held its state over an instant between them, and
// the sum is the one at that instant), at most Options.Collects reads;
// then it gives up with an error matching versioned.ErrConflict. Ids must
// be distinct; a missing document counts nothing.
func (m *Mover) Sum(ctx context.Context, ids ...any) (Total, error) {
	if err := store.CheckContext(ctx); err != nil {
		return Total{}, err
	}
	raw := make(bson.A, 0, len(ids))
	for _, id := range ids {
		r, err := store.CheckID(id)
		if err != nil {
			return Total{}, invalid("sum", "id", "", err)
		}
		raw = append(raw, r)
	}
	var prev map[string]int64
	for reads := 1; reads <= m.collects; reads++ {
		docs, err := m.collect(ctx, raw)
		if err != nil {
			return Total{}, fmt.Errorf("move: sum: %w", err)
		}
		versions := make(map[string]int64, len(docs))
		for _, d := range docs {
			versions[string(d.Lookup("_id").Value)] = versionOf(d.Lookup(m.version))
		}
		if prev != nil && equal(prev, versions) {
			t := m.total(docs)
			t.Reads = reads
			return t, nil
		}
		prev = versions
	}
	return Total{}, fmt.Errorf("move: sum: %d reads of %d documents never agreed: %w", m.collects, len(ids), versioned.ErrConflict)
}

func versionOf(v bson.RawValue) int64 {
	n, _ := v.AsInt64OK()
	return n
}

func equal(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// collect reads the documents once.
func (m *Mover) collect(ctx context.Context, ids bson.A) ([]bson.Raw, error) {
	var docs []bson.Raw
	err := m.majority.Read(ctx, func(c *mongo.Collection) error {
		docs = docs[:0]
		cur, err := c.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
		if err != nil {
			return err
		}
		defer cur.Close(ctx)
		for cur.Next(ctx) {
			docs = append(docs, append(bson.Raw(nil), cur.Current...))
		}
		return cur.Err()
	})
	return docs, err
}

// total computes the invariant's sum over one agreed read.
func (m *Mover) total(docs []bson.Raw) Total {
	credited := map[string]bool{}
	for _, d := range docs {
		for _, e := range m.entries(d, "i") {
			if doc, ok := e.Value().DocumentOK(); ok && doc.Lookup("r").Type == 0 && doc.Lookup("p").Type == 0 {
				credited[e.Key()] = true // a credit marker, not a refusal or a saga's preparation
			}
		}
	}
	var t Total
	for _, d := range docs {
		v, _ := d.Lookup(m.field).AsInt64OK()
		t.Values += v
		for _, e := range m.entries(d, "o") {
			if credited[e.Key()] {
				continue
			}
			if doc, ok := e.Value().DocumentOK(); ok {
				p, _ := doc.Lookup("v").AsInt64OK()
				t.Sum += p
				t.Pending++
			}
		}
	}
	t.Sum += t.Values
	return t
}

// entries returns the elements of part ("o", "i", "d") of d's state.
func (m *Mover) entries(d bson.Raw, part string) []bson.RawElement {
	doc, ok := d.Lookup(m.state, part).DocumentOK()
	if !ok {
		return nil
	}
	elems, _ := doc.Elements()
	return elems
}

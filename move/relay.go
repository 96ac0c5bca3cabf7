package move

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// errUnsettled fails an attempt whose step found the state moved under it;
// the next attempt starts again from a fresh read.
var errUnsettled = errors.New("move: relay: state changed during the attempt, trying again")

// marker is what a target says about a move: no marker, a credit, a
// refusal.
type marker int

const (
	noMarker marker = iota
	creditMarker
	refusalMarker
	preparedMarker // a saga's target admits the credit (MoveAll's P)
)

// readRaw reads a document at read concern majority; nil if missing.
func (m *Mover) readRaw(ctx context.Context, id bson.RawValue) (bson.Raw, error) {
	var doc bson.Raw
	err := m.majority.Read(ctx, func(c *mongo.Collection) error {
		d, err := c.FindOne(ctx, store.IDFilter(id)).Raw()
		doc = d
		return err
	})
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	return doc, err
}

// entry returns the subdocument part.id of the state field, if any.
func (m *Mover) entry(doc bson.Raw, part string, id bson.ObjectID) (bson.RawValue, bool) {
	v, err := doc.LookupErr(m.state, part, id.Hex())
	return v, err == nil
}

// markerOf says which marker doc carries for the move.
func (m *Mover) markerOf(doc bson.Raw, id bson.ObjectID) marker {
	v, ok := m.entry(doc, "i", id)
	if !ok {
		return noMarker
	}
	if d, ok := v.DocumentOK(); ok {
		if _, err := d.LookupErr("r"); err == nil {
			return refusalMarker
		}
		if _, err := d.LookupErr("p"); err == nil {
			return preparedMarker
		}
	}
	return creditMarker
}

// run is the relay job's handler: the steps of DESIGN.md, each decided
// from a fresh majority read and conditioned so that sending it again is
// harmless.
func (m *Mover) run(ctx context.Context, job *deferred.Job, a relayArgs) error {
	src, err := m.readRaw(ctx, a.From)
	if err != nil {
		return err
	}
	stamped := false // this attempt's C or R set the target's stamp to the job's
	if src == nil {
		return m.clean(ctx, job, a, stamped, false) // the source is gone: nothing to settle
	}
	if o, pending := m.entry(src, "o", a.M); pending {
		// The amount is the one the debit recorded with the pending entry,
		// not the job's: a job Sweep rebuilt from a refusal marker or an
		// outcome carries none.
		var debited time.Time
		var saga bson.ObjectID
		if d, ok := o.DocumentOK(); ok {
			if v, ok := d.Lookup("v").AsInt64OK(); ok {
				a.V = v
			}
			debited, _ = d.Lookup("at").TimeOK()
			saga, _ = d.Lookup("g").ObjectIDOK()
		}
		var outcome Status
		if saga.IsZero() {
			outcome, err = m.decide(ctx, job, a, &stamped)
		} else {
			outcome, err = m.settleStep(ctx, job, a, saga, &stamped)
		}
		if err != nil {
			return err
		}
		landed, err := m.finish(ctx, a, outcome)
		if err != nil {
			return err
		}
		if landed != nil {
			src = landed
			kind := observe.MoveDone
			if outcome == Returned {
				kind = observe.MoveReturned
			}
			m.event(ctx, kind, "relay", a, time.Since(debited))
		} else if src, err = m.readRaw(ctx, a.From); err != nil {
			return err
		}
	}
	return m.wrapUp(ctx, job, a, src, stamped)
}

// wrapUp is what follows F: from the source as read after it (nil:
// missing), O and U if the outcome is there, then K.
func (m *Mover) wrapUp(ctx context.Context, job *deferred.Job, a relayArgs, src bson.Raw, stamped bool) error {
	if src == nil {
		return m.clean(ctx, job, a, stamped, false)
	}
	settled := false // this attempt saw the outcome recorded (O applied)
	if v, ok := m.entry(src, "d", a.M); ok {
		if err := m.recordOne(ctx, a, v); err != nil {
			return err
		}
		if err := m.forget(ctx, a); err != nil {
			return err
		}
		settled = true
	}
	return m.clean(ctx, job, a, stamped, settled)
}

// decide makes the move's marker on the target final (C, or R after C's
// guard failed) and returns the outcome it means.
//
// A job's first attempt sends C without reading the target first: C and R
// are conditioned on the marker absent, so when one is there already (a
// relay that died before F, a duplicate job) both match nothing and the
// read after them finds it. A later attempt reads first, since an earlier
// one most likely left a marker.
func (m *Mover) decide(ctx context.Context, job *deferred.Job, a relayArgs, stamped *bool) (Status, error) {
	if job.Attempt > 1 {
		if outcome, marked, err := m.markedOutcome(ctx, a); err != nil || marked {
			return outcome, err
		}
	}
	absent := bson.D{{Key: m.path("i", a.M), Value: bson.D{{Key: "$exists", Value: false}}}}
	cond := m.admits(absent, a.V)
	now := time.Now()
	got, err := deferred.Guarded(ctx, job, m.repo, a.To, cond, bson.D{
		{Key: "$inc", Value: bson.D{{Key: m.field, Value: a.V}, {Key: m.state + ".n", Value: int64(1)}}},
		{Key: "$set", Value: bson.D{{Key: m.path("i", a.M), Value: bson.D{
			{Key: "v", Value: a.V}, {Key: "from", Value: a.From}, {Key: "at", Value: now},
		}}}},
	})
	switch {
	case err == nil:
		*stamped = true
	case errors.Is(err, versioned.ErrNotFound):
		return Returned, nil
	case errors.Is(err, versioned.ErrGuardFailed):
		got, err = deferred.Guarded(ctx, job, m.repo, a.To, absent, bson.D{
			{Key: "$inc", Value: bson.D{{Key: m.state + ".n", Value: int64(1)}}},
			{Key: "$set", Value: bson.D{{Key: m.path("i", a.M), Value: bson.D{
				{Key: "r", Value: true}, {Key: "v", Value: a.V}, {Key: "from", Value: a.From}, {Key: "at", Value: now},
			}}}},
		})
		if errors.Is(err, versioned.ErrNotFound) {
			return Returned, nil
		}
		if err != nil && !errors.Is(err, versioned.ErrGuardFailed) {
			return "", err
		}
		*stamped = err == nil
	default:
		return "", err
	}
	// Whichever of C or R (of any attempt, any job of the move) landed
	// first is the marker: the document the write returned says which,
	// or a read does.
	if got != nil && got.raw != nil {
		if mk := m.markerOf(got.raw, a.M); mk != noMarker {
			return outcomeOf(mk)
		}
	}
	if outcome, marked, err := m.markedOutcome(ctx, a); err != nil || marked {
		return outcome, err
	}
	return "", errUnsettled
}

// markedOutcome reads the target at majority: the outcome its marker of
// the move means (returned if the target is missing), and marked false if
// it has none.
func (m *Mover) markedOutcome(ctx context.Context, a relayArgs) (outcome Status, marked bool, err error) {
	dst, err := m.readRaw(ctx, a.To)
	if err != nil {
		return "", false, err
	}
	if dst == nil {
		return Returned, true, nil
	}
	if mk := m.markerOf(dst, a.M); mk != noMarker {
		outcome, err := outcomeOf(mk)
		return outcome, true, err
	}
	return "", false, nil
}

// outcomeOf is the outcome a final marker means. A prepared marker is
// never final, and a plain move's target never has one (only MoveAll's P
// writes them, under the saga's own move ids).
func outcomeOf(mk marker) (Status, error) {
	switch mk {
	case creditMarker:
		return Done, nil
	case preparedMarker:
		return "", retry.Permanent(errors.New("move: relay: a move outside a saga found a prepared marker"))
	case noMarker, refusalMarker:
	}
	return Returned, nil
}

// finish is F: the pending entry leaves the source, with the outcome in its
// place and, for a return, the value back. A failed guard means an earlier
// copy did it.
// It returns the source as F left it when F applied now.
func (m *Mover) finish(ctx context.Context, a relayArgs, outcome Status) (bson.Raw, error) {
	inc := bson.D{}
	if outcome == Returned {
		inc = append(inc, bson.E{Key: m.field, Value: a.V})
	}
	update := bson.D{
		{Key: "$unset", Value: bson.D{{Key: m.path("o", a.M), Value: ""}}},
		{Key: "$set", Value: bson.D{{Key: m.path("d", a.M), Value: bson.D{
			{Key: "s", Value: string(outcome)}, {Key: "to", Value: a.To}, {Key: "v", Value: a.V}, {Key: "at", Value: time.Now()},
		}}}},
	}
	if len(inc) > 0 {
		update = append(update, bson.E{Key: "$inc", Value: inc})
	}
	got, err := m.repo.Guarded(ctx, a.From, m.exists("o", a.M), update)
	switch {
	case errors.Is(err, versioned.ErrGuardFailed) || errors.Is(err, versioned.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return got.raw, nil
}

func (m *Mover) exists(part string, id bson.ObjectID) bson.D {
	return bson.D{{Key: m.path(part, id), Value: bson.D{{Key: "$exists", Value: true}}}}
}

// outcomeRecord is O's upsert of the outcome d (S.d.m, as F fixed it) of
// the move of a: the record is inserted once and never changed.
func (m *Mover) outcomeRecord(a relayArgs, d bson.RawValue) (filter, update bson.D, err error) {
	s, ok := outcomeIn(d)
	if !ok {
		return nil, nil, retry.Permanent(fmt.Errorf("move: relay %s: outcome is not a string", a.M.Hex()))
	}
	if doc, ok := d.DocumentOK(); ok { // the amount F recorded, as in run
		if v, ok := doc.Lookup("v").AsInt64OK(); ok {
			a.V = v
		}
	}
	return bson.D{{Key: "_id", Value: a.M}}, bson.D{{Key: "$setOnInsert", Value: bson.D{
		{Key: "outcome", Value: s}, {Key: "from", Value: a.From}, {Key: "to", Value: a.To}, {Key: "v", Value: a.V},
	}}}, nil
}

// recordOne is O for one move.
func (m *Mover) recordOne(ctx context.Context, a relayArgs, d bson.RawValue) error {
	filter, update, err := m.outcomeRecord(a, d)
	if err != nil {
		return err
	}
	_, err = m.outcomes.UpdateOne(ctx, filter, update, options.UpdateOne().SetUpsert(true))
	if err != nil && !store.IsDuplicateKey(err) {
		return err
	}
	return nil
}

// forget is U, sent once O applied: the outcome leaves the source.
func (m *Mover) forget(ctx context.Context, a relayArgs) error {
	_, err := m.repo.Guarded(ctx, a.From, m.exists("d", a.M), bson.D{
		{Key: "$unset", Value: bson.D{{Key: m.path("d", a.M), Value: ""}}},
		{Key: "$inc", Value: bson.D{{Key: m.state + ".n", Value: int64(-1)}}},
	})
	if errors.Is(err, versioned.ErrGuardFailed) || errors.Is(err, versioned.ErrNotFound) {
		return nil
	}
	return err
}

// clean is K: the target's marker goes, once the move's outcome is
// recorded (O). settled says this attempt recorded it; otherwise (the job
// found the source missing, or with neither the entry nor the outcome)
// clean reads the outcomes collection first: a read only on that path,
// since a job that settles its move records the outcome. Without the
// record the marker is the only proof on the target that the move was
// credited (or refused, or prepared), and a source read that missed the
// pending entry (a source deleted and inserted again) must not take it
// away: keep decides (DESIGN.md, Lemmas 1 and 9).
//
// K goes with the job's stamp (fenced), so that no copy of a C or R of an
// earlier job of the key can land after it (Lemma 2), unless this
// attempt's C or R set that stamp already (deferred refuses a second
// fenced write to one document in an attempt): then, and when the fenced
// write finds the stamp set, a plain write conditioned on the marker. With
// the outcome recorded, K removes a prepared marker too: it is a late copy
// of P (Lemma 9, case (a)). A K that matches nothing found the marker gone;
// one that lands later (a held P) is left to the next Sweep.
func (m *Mover) clean(ctx context.Context, job *deferred.Job, a relayArgs, stamped, settled bool) error {
	if !settled {
		s, err := m.recorded(ctx, bson.D{{Key: "_id", Value: a.M}})
		if err != nil {
			return err
		}
		if s == "" {
			return m.keep(ctx, a)
		}
	}
	cond := bson.D{{Key: m.path("i", a.M), Value: bson.D{{Key: "$exists", Value: true}}}}
	update := m.unmark(a)
	if !stamped {
		got, err := deferred.Guarded(ctx, job, m.repo, a.To, cond, update)
		switch {
		case errors.Is(err, versioned.ErrNotFound) || errors.Is(err, versioned.ErrGuardFailed):
			return nil
		case err != nil:
			return err
		}
		if got != nil && got.raw != nil {
			if _, ok := m.entry(got.raw, "i", a.M); !ok {
				return nil // the fenced write removed it
			}
		}
	}
	// The stamp is at least the job's: a plain write, conditioned on the
	// marker, removes it if the fenced one found it applied earlier.
	return m.unmarkPlain(ctx, a)
}

// unmarkPlain is K as a plain write, conditioned on the marker: sent once
// the target's stamp is at least the job's (or the run's last).
func (m *Mover) unmarkPlain(ctx context.Context, a relayArgs) error {
	_, err := m.repo.Guarded(ctx, a.To, m.exists("i", a.M), m.unmark(a))
	if errors.Is(err, versioned.ErrNotFound) || errors.Is(err, versioned.ErrGuardFailed) {
		return nil
	}
	return err
}

// unmark is K's update: the marker of a goes.
func (m *Mover) unmark(a relayArgs) bson.D {
	return bson.D{
		{Key: "$unset", Value: bson.D{{Key: m.path("i", a.M), Value: ""}}},
		{Key: "$inc", Value: bson.D{{Key: m.state + ".n", Value: int64(-1)}}},
	}
}

// keep is what the relay does with the target's marker while the move's
// outcome is not recorded and the source holds no entry of it. A prepared
// marker goes (K_p) if its saga is decided "returned" (deciding it so if it
// is undecided, as settleStep does): no credit of it is ever sent. Any
// other marker stays: only F, which needs the source's entry, settles the
// move, and the job ends with nothing done. It neither retries (it would
// hold back the key's later jobs) nor dies (dead jobs are kept: one per
// Sweep run would pile up); Sweep sends another while the marker stays
// (DESIGN.md, "Missing source").
func (m *Mover) keep(ctx context.Context, a relayArgs) error {
	saga, mk, err := m.targetMarker(ctx, a)
	if err != nil || mk == noMarker {
		return err
	}
	if mk == preparedMarker {
		decided, err := m.decideSaga(ctx, saga, Returned)
		if err != nil {
			return err
		}
		if decided == Returned {
			return m.unprepare(ctx, a, saga)
		}
	}
	return nil // the source is out of sight: the marker waits for its entry
}

// targetMarker reads the target's marker of a, and the saga a prepared
// one names.
func (m *Mover) targetMarker(ctx context.Context, a relayArgs) (bson.ObjectID, marker, error) {
	dst, err := m.readRaw(ctx, a.To)
	if err != nil || dst == nil {
		return bson.ObjectID{}, noMarker, err
	}
	mk := m.markerOf(dst, a.M)
	if mk != preparedMarker {
		return bson.ObjectID{}, mk, nil
	}
	v, _ := m.entry(dst, "i", a.M)
	saga, ok := v.Document().Lookup("g").ObjectIDOK()
	if !ok {
		return bson.ObjectID{}, mk, retry.Permanent(fmt.Errorf("move: relay %s: a prepared marker names no saga", a.M.Hex()))
	}
	return saga, mk, nil
}

// unprepare is K_p: the prepared marker of a, naming saga, goes.
func (m *Mover) unprepare(ctx context.Context, a relayArgs, saga bson.ObjectID) error {
	_, err := m.repo.Guarded(ctx, a.To, bson.D{
		{Key: m.path("i", a.M) + ".p", Value: bson.D{{Key: "$exists", Value: true}}},
		{Key: m.path("i", a.M) + ".g", Value: saga},
	}, m.unmark(a))
	if errors.Is(err, versioned.ErrGuardFailed) || errors.Is(err, versioned.ErrNotFound) {
		return nil
	}
	return err
}

// outcomeIn returns the outcome an S.d entry holds.
func outcomeIn(d bson.RawValue) (string, bool) {
	doc, ok := d.DocumentOK()
	if !ok {
		return "", false
	}
	v, err := doc.LookupErr("s")
	if err != nil {
		return "", false
	}
	return v.StringValueOK()
}

package move

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/internal/canon"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// MaxSteps bounds the steps of one MoveAll.
const MaxSteps = 100

// ErrAborted is matched by MoveAll's error when the moves were not all
// made: every step that debited its source is returned to it, exactly once,
// by the relay.
var ErrAborted = errors.New("move: all: aborted, every debit is returned")

// Step is one move of a MoveAll: Amount from From to To, if From's value is
// at least Amount and From matches Cond (nil: no further condition).
type Step struct {
	From, To any
	Amount   int64
	Cond     any
}

// Saga is what MoveAll started: its id (for SagaStatus) and one move id per
// step, in the order of the steps (for Status).
type Saga struct {
	ID    bson.ObjectID
	Moves []bson.ObjectID
}

// StepError says why MoveAll aborted: which step, which end (a source whose
// value is short or whose condition failed: "from"; a target missing, not
// matching Options.Accept or unable to hold the credit: "to"), and the error, which it wraps
// (versioned.ErrGuardFailed, versioned.ErrNotFound, versioned.ErrUnknownOutcome,
// a context's error). It matches ErrAborted. Step is -1 when the relay
// aborted the saga first (MoveAll took longer than Options.Grace).
type StepError struct {
	Saga bson.ObjectID
	Step int
	End  string
	Err  error
}

// Error returns a message with the saga, the step and the cause.
func (e *StepError) Error() string {
	if e.Step < 0 {
		return fmt.Sprintf("move: all %s: aborted by the relay (not decided within Options.Grace)", e.Saga.Hex())
	}
	return fmt.Sprintf("move: all %s: aborted at step %d (%s): %v", e.Saga.Hex(), e.Step, e.End, e.Err)
}

// Is reports whether target is ErrAborted.
func (e *StepError) Is(target error) bool { return target == ErrAborted }

// Unwrap returns the step's error.
func (e *StepError) Unwrap() error { return e.Err }

// MoveAll makes every step's move or none of them: an order that reserves
// several items, all or nothing. Each step's debit is one statement on its
// source, as Move's, with the saga's id in the pending entry; then its
// target is prepared (a marker that admits the credit, written only if the
// target exists, matches Options.Accept and can hold the credit, with the
// saga's earlier steps into it). When every debit and every
// preparation landed, the saga is decided "done" in one write to the
// outcomes collection, and the relay credits every target, exactly once;
// if any failed, it is decided "returned", and every debit that landed is
// returned to its source, exactly once: by MoveAll itself before it
// returns, or by the relay for a debit whose outcome was unknown and that
// lands later. Nothing is credited before the decision, and the decision
// is made once.
//
// It costs two round trips per step (debit, preparation), one for the
// decision, and one enqueue per step (plus one return per debited step when
// it aborts); the credits are the relay's. A
// MoveAll that does not decide within Options.Grace (its process died, or
// stalled) is decided "returned" by the relay of the first of its moves
// that Sweep finds.
//
// The error is nil when the saga was decided done: every target is then
// credited (or will be, by the relay), and Status of each move says Done
// once it is. Otherwise it is a *StepError matching ErrAborted and the
// step's own error (versioned.ErrGuardFailed: a source's value is short or
// its Cond failed, or a target does not match Options.Accept or cannot hold
// the credit;
// versioned.ErrNotFound: a source or a target is missing), or an
// *InvalidError for bad input (nothing sent), or, when the decision's own
// write could not be settled, an error matching
// versioned.ErrUnknownOutcome: SagaStatus tells, and the relay decides
// "returned" if the decision never landed.
//
// A target deleted after it was prepared, even if a document is inserted
// again under its id, leaves the set of documents (see the package doc):
// its step is returned alone. A source deleted while its step is pending
// takes the step's value with it; if its saga is done, its target's
// marker of the step stays until the source is back with its entry, as for
// a move (see the package doc).
func (m *Mover) MoveAll(ctx context.Context, steps []Step) (Saga, error) {
	if err := store.CheckContext(ctx); err != nil {
		return Saga{}, err
	}
	if len(steps) == 0 || len(steps) > MaxSteps {
		return Saga{}, invalid("all", "steps", fmt.Sprintf("%d steps: from 1 to %d", len(steps), MaxSteps), nil)
	}
	args := make([]relayArgs, len(steps))
	for i, s := range steps {
		src, dst, err := checkEnds("all", s.From, s.To)
		if err != nil {
			return Saga{}, err
		}
		if s.Amount <= 0 {
			return Saga{}, invalid("all", "amount", fmt.Sprintf("step %d: %d is not positive", i, s.Amount), nil)
		}
		if s.Cond != nil {
			if _, err := bson.Marshal(s.Cond); err != nil {
				return Saga{}, invalid("all", "cond", fmt.Sprintf("step %d: not a document", i), err)
			}
		}
		args[i] = relayArgs{M: bson.NewObjectID(), From: src, To: dst, V: s.Amount}
	}
	into, err := creditsInto(args)
	if err != nil {
		return Saga{}, err
	}
	saga := Saga{ID: bson.NewObjectID(), Moves: make([]bson.ObjectID, len(steps))}
	for i := range args {
		saga.Moves[i] = args[i].M
	}
	sent := 0 // steps whose debit may have landed: each gets a relay job
	var abort *StepError
	for i, a := range args {
		if err := m.debit(ctx, a, steps[i].Cond, saga.ID); err != nil {
			abort = &StepError{Saga: saga.ID, Step: i, End: "from", Err: err}
			if !errors.Is(err, versioned.ErrGuardFailed) && !errors.Is(err, versioned.ErrNotFound) {
				sent++ // it may have landed, or a copy may yet: its job returns it
			}
			break
		}
		sent++
		if err := m.prepare(ctx, a, saga.ID, into[i]); err != nil {
			abort = &StepError{Saga: saga.ID, Step: i, End: "to", Err: err}
			break
		}
	}
	// The decision, and the relay jobs, are sent even when ctx ended (a
	// step failed because of it): they are what settles the debits now
	// rather than after Grace.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	want := Done
	if abort != nil {
		want = Returned
	}
	got, err := m.decideSaga(dctx, saga.ID, want)
	if err == nil && got == Returned {
		// Give the value back now rather than when the relay runs: F,
		// conditioned on the pending entry, applies once whoever sends it.
		// What fails here, the relay does.
		for _, a := range args[:sent] {
			if landed, _ := m.finish(dctx, a, Returned); landed != nil {
				m.event(ctx, observe.MoveReturned, "all", a, 0)
			}
		}
	}
	for _, a := range args[:sent] {
		_, _ = m.relay.Enqueue(store.NoSession(dctx), a.To, a)
	}
	switch {
	case err != nil:
		if abort != nil {
			return saga, abort
		}
		return saga, &versioned.UnknownOutcomeError{Pkg: "move", Op: "all", ID: saga.ID, Subject: "saga " + saga.ID.Hex(),
			Reason: "the decision could not be written or read: SagaStatus tells, and the relay decides returned if it never landed", Err: err}
	case got == Done:
		return saga, nil
	case abort != nil:
		return saga, abort
	default:
		return saga, &StepError{Saga: saga.ID, Step: -1}
	}
}

// debit is D of a saga's step: Move's debit, with the saga's id in the
// pending entry.
func (m *Mover) debit(ctx context.Context, a relayArgs, cond any, saga bson.ObjectID) error {
	filter := bson.D{{Key: m.field, Value: bson.D{{Key: "$gte", Value: a.V}}}}
	if cond != nil {
		filter = bson.D{{Key: "$and", Value: bson.A{filter, cond}}}
	}
	entry := bson.D{{Key: "to", Value: a.To}, {Key: "v", Value: a.V}, {Key: "at", Value: time.Now()}}
	if !saga.IsZero() {
		entry = append(entry, bson.E{Key: "g", Value: saga})
	}
	update := bson.D{
		{Key: "$inc", Value: bson.D{{Key: m.field, Value: -a.V}, {Key: m.state + ".n", Value: int64(1)}}},
		{Key: "$set", Value: bson.D{{Key: m.path("o", a.M), Value: entry}}},
	}
	if err := m.send(ctx, a.From, filter, update); err != nil {
		return fmt.Errorf("move: debit %s: %w", a.From, err)
	}
	op := "move"
	if !saga.IsZero() {
		op = "all"
	}
	m.event(ctx, observe.MoveDebited, op, a, 0)
	return nil
}

// send is a caller's Guarded write (D, P), sent again under Options.Retry
// while it fails with a transient error: Guarded reports an error other
// than an unknown outcome only for a write it did not apply (versioned's
// "at most once"), so sending it again cannot apply it twice. A connection
// pool cleared by another operation's network error fails every write in
// flight on the client at once; without this, each would abort its saga.
func (m *Mover) send(ctx context.Context, id bson.RawValue, cond, update bson.D) error {
	return retry.Do(ctx, m.retry, func(ctx context.Context) error {
		_, err := m.repo.Guarded(ctx, id, cond, update)
		return err
	})
}

// creditsInto returns, for each step, the sum of its amount and those of
// the steps before it into the same target (as the server matches ids: 7
// and NumberLong(7) are one): what the target must be able to hold when
// the step is prepared, since a done saga credits them all.
// Amounts into one target that sum past the largest int64 are bad input.
func creditsInto(args []relayArgs) ([]int64, error) {
	into := make([]int64, len(args))
	for i, a := range args {
		into[i] = a.V
		for j := i - 1; j >= 0; j-- {
			if canon.Same(args[j].To, a.To) {
				if into[j] > math.MaxInt64-a.V {
					return nil, invalid("all", "amount", fmt.Sprintf("steps %d and before into one target sum past the largest int64", i), nil)
				}
				into[i] = into[j] + a.V
				break
			}
		}
	}
	return into, nil
}

// prepare is P: the target admits the saga's credit of a (it exists,
// matches Options.Accept and can hold total, the step's amount with the
// saga's earlier steps into it: admits), recorded as a prepared marker, which only the
// relay's credit of a decided-done saga turns into a credit marker.
func (m *Mover) prepare(ctx context.Context, a relayArgs, saga bson.ObjectID, total int64) error {
	cond := m.admits(bson.D{{Key: m.path("i", a.M), Value: bson.D{{Key: "$exists", Value: false}}}}, total)
	err := m.send(ctx, a.To, cond, bson.D{
		{Key: "$inc", Value: bson.D{{Key: m.state + ".n", Value: int64(1)}}},
		{Key: "$set", Value: bson.D{{Key: m.path("i", a.M), Value: bson.D{
			{Key: "p", Value: true}, {Key: "v", Value: a.V}, {Key: "from", Value: a.From}, {Key: "g", Value: saga},
			{Key: "at", Value: time.Now()},
		}}}},
	})
	if err != nil {
		return fmt.Errorf("move: prepare %s: %w", a.To, err)
	}
	return nil
}

// decideSaga writes the saga's decision if none is written yet, and returns
// the decision that stands (the first written): an upsert of the saga's
// record in the outcomes collection with $setOnInsert, so every copy and
// every competitor writes at most the first. It returns once a majority
// read finds the decision, so that no later read, after a failover, finds
// another.
func (m *Mover) decideSaga(ctx context.Context, saga bson.ObjectID, want Status) (Status, error) {
	filter := bson.D{{Key: "_id", Value: saga}}
	return retry.DoValue(ctx, m.retry, func(ctx context.Context) (Status, error) {
		_, err := m.outcomes.UpdateOne(ctx, filter, bson.D{{Key: "$setOnInsert", Value: bson.D{
			{Key: "saga", Value: true}, {Key: "outcome", Value: string(want)}, {Key: "at", Value: time.Now()},
		}}}, options.UpdateOne().SetUpsert(true))
		if err != nil && !store.IsDuplicateKey(err) { // a concurrent upsert inserted it: read it
			return "", err
		}
		s, err := m.sagaOutcome(ctx, saga)
		if err == nil && s == "" {
			err = errNotVisible
		}
		return s, err
	})
}

// errNotVisible: a decision written and acknowledged that a majority read
// does not find yet; read again.
var errNotVisible error = notVisibleError{}

type notVisibleError struct{}

func (notVisibleError) Error() string {
	return "move: all: the decision is not visible at majority yet"
}
func (notVisibleError) Retryable() bool { return true }

// sagaOutcome reads the saga's decision at majority: "" if none.
func (m *Mover) sagaOutcome(ctx context.Context, saga bson.ObjectID) (Status, error) {
	return m.recorded(ctx, bson.D{{Key: "_id", Value: saga}, {Key: "saga", Value: true}})
}

// recorded reads the outcome of the record filter names, a move's or a
// saga's, at majority: "" if none.
func (m *Mover) recorded(ctx context.Context, filter bson.D) (Status, error) {
	var rec struct {
		Outcome string `bson:"outcome"`
	}
	err := m.decided.Read(ctx, func(c *mongo.Collection) error {
		return c.FindOne(ctx, filter).Decode(&rec)
	})
	if errors.Is(err, mongo.ErrNoDocuments) {
		return "", nil
	}
	return Status(rec.Outcome), err
}

// SagaStatus returns the decision of the saga id: Done (every step is
// credited, or will be by the relay: Status of each move says when),
// Returned (every step that debited is returned, or will be), or
// ErrNotFound while it is undecided (MoveAll is still running, or its
// process died: after Options.Grace the relay decides Returned).
func (m *Mover) SagaStatus(ctx context.Context, id bson.ObjectID) (Status, error) {
	if err := store.CheckContext(ctx); err != nil {
		return "", err
	}
	if id.IsZero() {
		return "", invalid("saga status", "id", "the zero ObjectID", nil)
	}
	s, err := m.sagaOutcome(ctx, id)
	switch {
	case err != nil:
		return "", fmt.Errorf("move: saga status %s: %w", id.Hex(), err)
	case s == "":
		return "", fmt.Errorf("move: saga status %s: %w", id.Hex(), ErrNotFound)
	}
	return s, nil
}

// settleStep decides the outcome of a saga's step from the saga's decision
// (deciding Returned if there is none: the relay runs a saga's move only
// after MoveAll decided, or after Sweep found it older than Grace), and for
// a saga decided Done, credits the target: C, conditioned on the prepared
// marker, fenced like Move's credit.
func (m *Mover) settleStep(ctx context.Context, job *deferred.Job, a relayArgs, saga bson.ObjectID, stamped *bool) (Status, error) {
	decided, err := m.decideSaga(ctx, saga, Returned)
	if err != nil {
		return "", err
	}
	if decided != Done {
		return Returned, nil // no credit of the saga is ever sent
	}
	dst, err := m.readRaw(ctx, a.To)
	switch {
	case err != nil:
		return "", err
	case dst == nil:
		return Returned, nil // deleted after it was prepared
	}
	switch m.markerOf(dst, a.M) {
	case creditMarker:
		return Done, nil
	case preparedMarker:
	default:
		// Done was decided only after every preparation landed, and K
		// removes a saga's marker only once its step's outcome is
		// recorded (Lemma 9): the target was deleted after it was
		// prepared, and inserted again. It has left the set, as a missing
		// one: its step is returned alone. (Or the step is settled and
		// this read of the source was behind: F matches nothing.)
		return Returned, nil
	}
	got, err := deferred.Guarded(ctx, job, m.repo, a.To, bson.D{{Key: m.path("i", a.M) + ".p", Value: bson.D{{Key: "$exists", Value: true}}}}, bson.D{
		{Key: "$inc", Value: bson.D{{Key: m.field, Value: a.V}}},
		{Key: "$set", Value: bson.D{{Key: m.path("i", a.M), Value: bson.D{
			{Key: "v", Value: a.V}, {Key: "from", Value: a.From}, {Key: "g", Value: saga}, {Key: "at", Value: time.Now()},
		}}}},
	})
	switch {
	case err == nil:
		*stamped = true
	case errors.Is(err, versioned.ErrNotFound):
		return Returned, nil
	case errors.Is(err, versioned.ErrGuardFailed):
	default:
		return "", err
	}
	if got != nil && got.raw != nil && m.markerOf(got.raw, a.M) == creditMarker {
		return Done, nil
	}
	if dst, err = m.readRaw(ctx, a.To); err != nil {
		return "", err
	}
	if dst == nil {
		return Returned, nil
	}
	if m.markerOf(dst, a.M) == creditMarker {
		return Done, nil
	}
	return "", errUnsettled
}

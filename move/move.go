package move

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/internal/canon"
	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// Sentinel errors. Match them with errors.Is. The debit's errors are
// versioned's (ErrGuardFailed, ErrNotFound, ErrUnknownOutcome, ...),
// wrapped.
var (
	// ErrInvalid is matched by every error that refuses a caller's input
	// before anything is sent. It is [store.ErrInvalid].
	ErrInvalid = store.ErrInvalid
	// ErrNotFound is matched by Status's error for a move that the source
	// document does not know and that has no outcome record.
	ErrNotFound = errors.New("move: move not found")
)

// Status is where a move stands.
type Status string

// The statuses of a move.
const (
	// Pending: the value left the source; the move is not settled yet.
	Pending Status = "pending"
	// Done: the value was credited to the target, exactly once.
	Done Status = "done"
	// Returned: the credit could not apply (the target is missing or
	// refused it); the value went back to the source, exactly once.
	Returned Status = "returned"
)

// Defaults of Options.
const (
	DefaultStateField = "_mv"
	DefaultName       = "move"
	DefaultGrace      = time.Minute
	DefaultCollects   = 10
)

// Options configures a Mover. Field is required; each other zero field
// takes its default.
type Options struct {
	// Field is the top-level field that holds each document's value, an
	// integer (int32 or int64 in storage). Required.
	Field string
	// StateField is the subdocument where moves record their pending
	// entries and markers (DESIGN.md). It must not be written by anything
	// else. Default "_mv".
	StateField string
	// Name is the name of the relay's handler in the queue. Default "move".
	Name string
	// Accept is a condition the target must match for a credit to apply
	// (for instance {open: true}); a target that does not match it gets
	// the value returned to the source. nil means any existing target
	// whose value can hold the credit: a number that stays within int64,
	// or a missing field (the credit creates it); any other target is
	// refused whatever Accept says. The relay credits the moves into one
	// target that are due together in one statement, which checks Accept
	// once for them all; when Accept names a field a credit changes (Field,
	// the version, StateField, versioned's metadata, any field whose name
	// begins with "_" but _id) or holds $expr, $where, $function or
	// $jsonSchema, it credits them one at a time instead, each checked on
	// the document the one before it left.
	Accept bson.D
	// Grace is how old a pending entry must be before Sweep enqueues a
	// relay job for it. Default one minute.
	Grace time.Duration
	// Collects bounds how many times Sum reads the documents to find two
	// reads that agree. Default 10; at least 2.
	Collects int
	// Outcomes is the collection that keeps each settled move's outcome,
	// for Status. Default: the collection's name with "_moves" appended.
	// The Mover writes it with write concern majority, whatever the
	// collection's own (a MoveAll called inside a transaction writes its
	// decision in it: the commit's write concern then decides).
	Outcomes *mongo.Collection
	// Repo configures the repository the Mover writes through: its
	// MetaField and Reserved must be those of the application's own
	// repositories of the collection, and its VersionField the default
	// ("version"; another is refused). nil means versioned's defaults.
	Repo *versioned.Options
	// Retry is the policy under which Move and MoveAll send a debit or a
	// preparation again after a transient error that left it unapplied
	// (versioned reports such errors only for writes it did not apply; a
	// lost reply is settled instead). Zero fields take retry's defaults
	// (retries for 2 s). The relay's steps are retried by the queue.
	Retry retry.Policy
	// Observer, if not nil, receives the Mover's events (observe.MoveDebited
	// from Move, observe.MoveDone and observe.MoveReturned from the relay),
	// and the repository's when Repo has no Observer of its own. The relay
	// job's events are the queue's (deferred.Options.Observer).
	Observer observe.Observer
}

// account is how the Mover sees a document: its id and version, and the
// whole document as stored (raw), so that the document a write returns
// tells which marker it carries without another read.
type account struct {
	ID      bson.RawValue `bson:"_id"`
	Version int64         `bson:"version"`
	raw     bson.Raw
}

// UnmarshalBSON decodes the id and the version, and keeps the document.
func (a *account) UnmarshalBSON(data []byte) error {
	type fields account
	var f fields
	if err := bson.Unmarshal(data, &f); err != nil {
		return err
	}
	*a = account(f)
	a.raw = append(bson.Raw(nil), data...)
	return nil
}

// Mover moves value between documents of one collection. Make it with
// New; it is safe for concurrent use.
type Mover struct {
	coll     *mongo.Collection
	repo     *versioned.Repo[account]
	majority *settle.Majority
	outcomes *mongo.Collection
	decided  *settle.Majority // outcomes, read at majority
	relay    *deferred.Kind[relayArgs]
	field    string
	state    string
	version  string
	accept   bson.D
	runs     bool // Accept allows a run's credits in one statement (runMany)
	grace    time.Duration
	collects int
	retry    retry.Policy
	observer observe.Observer
}

// relayArgs is the argument of a relay job: the move, its ends, its value.
type relayArgs struct {
	M    bson.ObjectID `bson:"m"`
	From bson.RawValue `bson:"from"`
	To   bson.RawValue `bson:"to"`
	V    int64         `bson:"v"`
}

// New returns a Mover of the documents of coll, whose credits the queue q
// relays: run q.Run in every process that should relay moves, and call
// Sweep periodically in at least one. New registers the relay's handler
// in q (Options.Name) and makes the index Sweep uses.
func New(ctx context.Context, q *deferred.Queue, coll *mongo.Collection, opts *Options) (*Mover, error) {
	if err := store.CheckContext(ctx); err != nil {
		return nil, err
	}
	if q == nil || coll == nil {
		return nil, invalid("new", "queue", "nil queue or collection", nil)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	o.StateField = cmp.Or(o.StateField, DefaultStateField)
	o.Name = cmp.Or(o.Name, DefaultName)
	o.Grace = cmp.Or(o.Grace, DefaultGrace)
	o.Collects = cmp.Or(o.Collects, DefaultCollects)
	for name, f := range map[string]string{"Field": o.Field, "StateField": o.StateField} {
		if err := checkField(f); err != nil {
			return nil, invalid("new", name, err.Error(), nil)
		}
	}
	if o.Field == o.StateField || o.Field == "_id" {
		return nil, invalid("new", "Field", "must differ from StateField and _id", nil)
	}
	if err := o.Retry.Validate(); err != nil {
		return nil, invalid("new", "Retry", "", err)
	}
	if o.Grace < 0 || o.Collects < 2 {
		return nil, invalid("new", "Options", "Grace must not be negative, Collects must be at least 2", nil)
	}
	if o.Outcomes == nil {
		o.Outcomes = coll.Database().Collection(coll.Name() + "_moves")
	}
	// The relay removes a target's marker on the strength of a move's
	// outcome record, and MoveAll credits on a saga's decision: both must
	// survive a failover whatever the client's default (DESIGN.md, Lemma 1).
	o.Outcomes = o.Outcomes.Clone(options.Collection().SetWriteConcern(writeconcern.Majority()))
	repoOpts := o.Repo
	if o.Observer != nil && (repoOpts == nil || repoOpts.Observer == nil) {
		ro := versioned.Options{}
		if repoOpts != nil {
			ro = *repoOpts
		}
		ro.Observer = o.Observer
		repoOpts = &ro
	}
	repo, err := versioned.New[account](coll, repoOpts)
	if err != nil {
		return nil, fmt.Errorf("move: new: %w", err)
	}
	version := versioned.DefaultVersionField
	if o.Repo != nil && o.Repo.VersionField != "" {
		version = o.Repo.VersionField
	}
	if o.Field == version {
		return nil, invalid("new", "Field", "must differ from the version field", nil)
	}
	m := &Mover{
		coll: coll, repo: repo, majority: settle.NewMajority(coll), outcomes: o.Outcomes, decided: settle.NewMajority(o.Outcomes),
		field: o.Field, state: o.StateField, version: version, accept: o.Accept,
		grace: o.Grace, collects: o.Collects, retry: o.Retry, observer: o.Observer,
	}
	meta := versioned.DefaultMetaField
	if o.Repo != nil && o.Repo.MetaField != "" {
		meta = o.Repo.MetaField
	}
	m.runs = staticAccept(o.Accept, o.Field, o.StateField, version, meta)
	m.relay, err = deferred.RegisterRun(q, o.Name, m.run, m.runMany)
	if err != nil {
		return nil, fmt.Errorf("move: new: %w", err)
	}
	_, err = coll.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys:    bson.D{{Key: o.StateField + ".n", Value: 1}},
		Options: options.Index().SetName(o.StateField + "_pending"),
	})
	if err != nil {
		return nil, fmt.Errorf("move: new: index on %s.n: %w", o.StateField, store.ContextError(ctx))
	}
	return m, nil
}

// checkField refuses a field name a server could read as an operator or a
// path.
func checkField(f string) error {
	switch {
	case f == "":
		return errors.New("empty")
	case strings.HasPrefix(f, "$"), strings.Contains(f, "."), strings.ContainsRune(f, 0):
		return fmt.Errorf("%q starts with '$' or holds '.' or NUL", f)
	}
	return nil
}

// InvalidError reports bad input refused before anything was sent: the
// operation, what was refused, why. It matches ErrInvalid (and
// store.ErrInvalidID for a refused id) and unwraps to Err.
type InvalidError struct {
	Op, Field, Reason string
	Err               error
}

// Error returns a message with the operation, the field and the reason.
func (e *InvalidError) Error() string {
	msg := fmt.Sprintf("move: %s: invalid %s", e.Op, e.Field)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Unwrap returns the underlying error.
func (e *InvalidError) Unwrap() error { return e.Err }

func invalid(op, field, reason string, err error) error {
	return &InvalidError{Op: op, Field: field, Reason: reason, Err: err}
}

// admits is cond, and the conditions under which a target takes a credit
// of v: it matches Options.Accept, and its value is a number that $inc can
// raise by v without passing the largest int64, or missing ($inc creates
// it). A value of another type (an array of numbers too), or one so large that $inc would fail,
// makes the credit's guard fail rather than its statement, so the move is
// refused (R) and returned, as for a target that does not match Accept;
// otherwise the server's error would fail the relay's attempts until the
// job died, with the value pending for ever. ($lte matches numbers only,
// but also an array holding one: hence the $type.)
func (m *Mover) admits(cond bson.D, v int64) bson.D {
	all := bson.A{cond, bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: m.field, Value: bson.D{
			{Key: "$lte", Value: math.MaxInt64 - v},
			{Key: "$not", Value: bson.D{{Key: "$type", Value: "array"}}},
		}}},
		bson.D{{Key: m.field, Value: bson.D{{Key: "$exists", Value: false}}}},
	}}}}
	if m.accept != nil {
		all = append(all, m.accept)
	}
	return bson.D{{Key: "$and", Value: all}}
}

// path returns the dotted path of a move's entry under part ("o", "i",
// "d") of the state field: hex digits only, never input.
func (m *Mover) path(part string, id bson.ObjectID) string {
	return m.state + "." + part + "." + id.Hex()
}

// Move takes amount from the document from and moves it to the document
// to, exactly once. The debit is one statement on from: if from's value
// is at least amount and from matches cond (nil: no further condition),
// its value goes down by amount and the pending entry is recorded in the
// same statement (one round trip, as versioned.Repo.Guarded). Then a relay
// job is enqueued that credits to, or returns the value to from when the
// credit cannot apply.
//
// It returns the move's id (for Status) once the debit landed, and a nil
// error: if the enqueue then fails, Sweep relays the move after
// Options.Grace. Errors (nothing moved, except for an unknown outcome):
// an *InvalidError for bad input; versioned's *GuardError (ErrGuardFailed)
// when from's value is below amount or cond does not hold; versioned's
// *NotFoundError when from does not exist; versioned's
// *UnknownOutcomeError when the debit's outcome could not be settled: the
// move's id is returned with it, for Status; if the debit landed, Sweep
// relays it.
func (m *Mover) Move(ctx context.Context, from, to any, amount int64, cond any) (bson.ObjectID, error) {
	if err := store.CheckContext(ctx); err != nil {
		return bson.ObjectID{}, err
	}
	src, dst, err := checkEnds("move", from, to)
	if err != nil {
		return bson.ObjectID{}, err
	}
	if amount <= 0 {
		return bson.ObjectID{}, invalid("move", "amount", fmt.Sprintf("%d is not positive", amount), nil)
	}
	if cond != nil {
		if _, err := bson.Marshal(cond); err != nil {
			return bson.ObjectID{}, invalid("move", "cond", "not a document", err)
		}
	}
	a := relayArgs{M: bson.NewObjectID(), From: src, To: dst, V: amount}
	if err := m.debit(ctx, a, cond, bson.ObjectID{}); err != nil {
		if errors.Is(err, store.ErrUnknownOutcome) {
			return a.M, err // it may have landed: Status(id) and Sweep will tell
		}
		return bson.ObjectID{}, err
	}
	// The debit landed: a failed enqueue leaves the entry to Sweep.
	_, _ = m.relay.Enqueue(store.NoSession(ctx), dst, a)
	return a.M, nil
}

// checkEnds checks both ids and that they differ.
func checkEnds(op string, from, to any) (src, dst bson.RawValue, err error) {
	if src, err = store.CheckID(from); err != nil {
		return src, dst, invalid(op, "from", "", err)
	}
	if dst, err = store.CheckID(to); err != nil {
		return src, dst, invalid(op, "to", "", err)
	}
	if canon.Same(src, dst) {
		return src, dst, invalid(op, "to", "the same document as from", nil)
	}
	return src, dst, nil
}

// event reports an event of the move a, if the Mover has an Observer.
func (m *Mover) event(ctx context.Context, k observe.Kind, op string, a relayArgs, age time.Duration) {
	if m.observer == nil {
		return
	}
	m.observer.Observe(ctx, observe.Event{
		Kind: k, Op: op, Database: m.coll.Database().Name(), Collection: m.coll.Name(), ID: a.M,
		From: text(a.From), To: text(a.To), Amount: a.V, Age: age,
	})
}

// text is an id as an event carries it: extended JSON, cut to 64 bytes.
func text(v bson.RawValue) string {
	s := v.String()
	if len(s) > 64 {
		s = s[:61] + "..."
	}
	return s
}

package deferred

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// State is the state of a job.
type State string

// The states of a job: enqueued available, made running by a worker, then
// completed, dead or cancelled, or back to retryable or available.
const (
	// StateAvailable: waiting for its turn on its key.
	StateAvailable State = "available"
	// StateRunning: a worker claimed it (if lost, the next one takes over).
	StateRunning State = "running"
	// StateRetryable: an attempt failed; it runs again after a backoff.
	StateRetryable State = "retryable"
	// StateCompleted: its handler returned nil.
	StateCompleted State = "completed"
	// StateDead: it failed MaxAttempts times, or permanently; Requeue or Cancel it.
	StateDead State = "dead"
	// StateCancelled: Cancel took it out of the queue; it never runs again.
	StateCancelled State = "cancelled"
)

// stateSkipped marks a tombstone: a number reserved but never used.
const stateSkipped State = "skipped"

// States lists the states of a job, in the order of a job's life.
func States() []State {
	return []State{StateAvailable, StateRunning, StateRetryable, StateCompleted, StateDead, StateCancelled}
}

// finished reports whether a job in state s no longer holds its key.
func finished(s State) bool {
	return s == StateCompleted || s == StateDead || s == StateCancelled || s == stateSkipped
}

// AttemptError is the record of a failed attempt: its number (from 1),
// when it failed (server time, estimated), the message (cut to 2 KiB), and
// whether the handler panicked (the message then holds value and stack).
type AttemptError struct {
	Attempt int       `bson:"attempt"`
	At      time.Time `bson:"at"`
	Error   string    `bson:"error"`
	Panic   bool      `bson:"panic,omitempty"`
}

// Job is a deferred change: what a handler receives, and what Queue.Job
// reports, as stored when it was read.
type Job struct {
	// ID is the job's id, stable across attempts: an idempotency key for a
	// handler, the location to poll for a service.
	ID bson.ObjectID `bson:"_id"`
	// Key is the key the job was enqueued with: jobs of a key run one at a
	// time, in enqueue order. Keys the server finds equal are one key (7,
	// NumberLong(7) and 7.0), whose jobs keep each its own form here.
	Key bson.RawValue `bson:"k"`
	// Seq is the job's sequence number on its key (Stamp records it).
	Seq int64 `bson:"s"`
	// Name is the name of the job's handler.
	Name string `bson:"name"`
	// Args is the encoded argument.
	Args  bson.RawValue `bson:"args"`
	State State         `bson:"state"`
	// Attempt is the number of the current (or last) attempt, from 1;
	// snoozes and interrupted attempts are not counted.
	Attempt int `bson:"attempt"`
	// MaxAttempts is the number of attempts after which the job is dead.
	MaxAttempts int `bson:"max"`
	// EnqueuedAt is when the job was enqueued (the enqueuer's clock).
	EnqueuedAt time.Time `bson:"enqueued"`
	// RunAt, if set, is when the job may run next (after a failure, a snooze).
	RunAt      time.Time `bson:"runAt,omitempty"`
	StartedAt  time.Time `bson:"started,omitempty"`
	FinishedAt time.Time `bson:"finished,omitempty"`
	// Owner and Epoch are the worker (Options.Owner) that ran the last
	// attempt and the fencing token of its claim on the key.
	Owner string `bson:"owner,omitempty"`
	Epoch int64  `bson:"epoch,omitempty"`
	// Errors holds the failed attempts, oldest first: the last MaxErrors.
	Errors []AttemptError `bson:"errors,omitempty"`
	// MayHaveApplied is true when an attempt's write to a target document
	// may have landed: a Guarded or Modify call that applied (or found
	// applied) the change, or whose outcome is unknown; a handler that
	// called Stamp; an attempt whose worker was lost. Requeue refuses such
	// a job: under a new sequence number it could apply twice.
	MayHaveApplied bool `bson:"mw,omitempty"`
	// Claim is the id of the last claim that took the job (zero until its
	// first): a new one for every claim, so that a write acting on the job
	// under a claim, which is conditioned on it, matches nothing once the
	// job has moved on (DESIGN.md, Claims of jobs).
	Claim bson.ObjectID `bson:"c,omitempty"`

	q   *Queue
	att *attempt  // this delivery's writes, for a job handed to a handler
	cl  claimSent // this worker's claim of the job, once sent
}

// MaxErrors is how many failed attempts (the newest) a job keeps in Errors.
const MaxErrors = 20

// keyDoc is a key's document: the i-th reservation is Off+i, the head is
// Off+Done+1, and N = Tail-Done numbers wait (DESIGN.md, Collections).
type keyDoc struct {
	ID   bson.RawValue `bson:"_id"`
	Off  int64         `bson:"off"`
	Tail int64         `bson:"tail"`
	Done int64         `bson:"done"`
	N    int64         `bson:"n"`
	Due  time.Time     `bson:"due,omitempty"`
	Hole *hole         `bson:"hole,omitempty"`
	H    string        `bson:"h,omitempty"`
	T    time.Time     `bson:"t,omitempty"`
	R    bson.ObjectID `bson:"r"`
}

// hole is a reserved number found without its job, and since when.
type hole struct {
	Seq   int64     `bson:"s"`
	Since time.Time `bson:"since"`
}

// handler is a registered handler. batch, where set (NewChange), applies a
// run of its jobs of one key together: see runOf.
type handler struct {
	name  string
	typ   reflect.Type
	run   func(ctx context.Context, job *Job) error
	batch func(ctx context.Context, jobs []*Job) (int, error)
}

// Queue is a durable queue of deferred changes in the jobs collection given
// to New and a keys collection beside it ("<jobs>_keys", a small document
// per key). A Queue is safe for concurrent use.
type Queue struct {
	jobs, keys *mongo.Collection
	c          Options        // with the defaults filled in
	leases     *lease.Manager // its Clock estimates the server's time, where the queue dates things
	local      store.Clock    // durations, deadlines and waits of this process
	ns         string

	mu       sync.RWMutex
	handlers map[string]*handler

	wake chan struct{}

	// ready is a 1-slot semaphore EnsureIndexes holds; callers wait for it with their context.
	ready   chan struct{}
	isReady bool // guarded by ready
	ttl     bool // guarded by ready
	// expr: the server evaluates $expr in a write filter (the stamps' bound, Options.MaxStamps).
	expr atomic.Bool
	// maj holds the majority readers of the settling reads.
	maj struct {
		once       sync.Once
		jobs, keys *settle.Majority
	}
}

// New returns a Queue whose jobs live in jobs and whose keys live in the
// collection "<jobs>_keys" of the same database. It does no I/O: the
// indexes are made by EnsureIndexes, which Run and the first Enqueue call.
// A nil collection or a bad Options field is an *InvalidError.
func New(jobs *mongo.Collection, opts *Options) (*Queue, error) {
	if jobs == nil {
		return nil, invalid("new", "jobs", "nil collection", nil)
	}
	c, err := opts.config()
	if err != nil {
		return nil, err
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), rand.Text()[:8])
	}
	keys := jobs.Database().Collection(jobs.Name() + "_keys")
	leases, err := lease.New(keys, &lease.Options{
		TTL: c.VisibilityTimeout, Owner: c.Owner, Mode: c.LeaseMode, Clock: c.Clock, ResolveTimeout: c.ResolveTimeout,
		Observer: c.Observer, Now: c.LocalClock.Now,
	})
	if err != nil {
		return nil, invalid("new", "lease options", "refused by the lease package", err)
	}
	q := &Queue{
		jobs: jobs, keys: keys, c: c, leases: leases, local: c.LocalClock,
		ns:       jobs.Database().Name() + "." + jobs.Name(),
		handlers: map[string]*handler{}, wake: make(chan struct{}, 1), ready: make(chan struct{}, 1),
	}
	return q, nil
}

// Jobs returns the jobs collection.
func (q *Queue) Jobs() *mongo.Collection { return q.jobs }

// Keys returns the keys collection.
func (q *Queue) Keys() *mongo.Collection { return q.keys }

// Owner returns the owner string this Queue's workers write in their claims.
func (q *Queue) Owner() string { return q.c.Owner }

// EnsureIndexes creates the indexes the queue needs: a unique one on a
// job's key and sequence number, one on the state (Counts), one on the
// keys' pending count (the workers' search), and, where the server has TTL
// indexes, a TTL index that deletes completed and cancelled jobs Retention
// after they finished; it reports whether it made that one (elsewhere Run
// deletes them with Sweep). It is idempotent; Run and the first Enqueue
// call it. A call that waits for another one's round trips ends with its
// own context.
func (q *Queue) EnsureIndexes(ctx context.Context) (ttl bool, err error) {
	if err := checkCtx(ctx, "ensure indexes"); err != nil {
		return false, err
	}
	select {
	case q.ready <- struct{}{}:
	case <-ctx.Done():
		return false, fmt.Errorf("deferred: ensure indexes: %w", store.ContextError(ctx))
	}
	defer func() { <-q.ready }()
	if q.isReady {
		return q.ttl, nil
	}
	ctx = store.NoSession(ctx)
	caps, err := store.For(q.jobs.Database().Client()).Capabilities(ctx, q.jobs.Database())
	if err != nil {
		return false, fmt.Errorf("deferred: ensure indexes: probe the server: %w", err)
	}
	expire := options.Index().SetName("deferred_expire")
	if caps.TTLIndexes {
		expire.SetExpireAfterSeconds(0)
	}
	for coll, models := range map[*mongo.Collection][]mongo.IndexModel{
		q.jobs: {
			{Keys: bson.D{{Key: "p", Value: 1}}, Options: options.Index().SetName("deferred_place").SetUnique(true)},
			{Keys: bson.D{{Key: "state", Value: 1}}, Options: options.Index().SetName("deferred_state")},
			{Keys: bson.D{{Key: "expireAt", Value: 1}}, Options: expire},
		},
		q.keys: {{Keys: bson.D{{Key: "n", Value: 1}, {Key: "t", Value: 1}}, Options: options.Index().SetName("deferred_pending")}},
	} {
		if err := createIndexes(ctx, coll, q.c.Retry, models); err != nil {
			return false, fmt.Errorf("deferred: ensure indexes on %s: %w", coll.Name(), err)
		}
	}
	q.isReady, q.ttl = true, caps.TTLIndexes
	q.expr.Store(caps.Expr)
	return q.ttl, nil
}

// createIndexes creates those of models (each named) that coll lacks,
// listing them first (FerretDB v1 drops the connection on an index that
// exists), a pass at a time under policy: a transient failure (such as
// that dropped connection, when another process created one meanwhile)
// lists again.
func createIndexes(ctx context.Context, coll *mongo.Collection, policy retry.Policy, models []mongo.IndexModel) error {
	return retry.Do(ctx, policy, func(ctx context.Context) error {
		names, err := coll.Indexes().ListSpecifications(ctx)
		var se mongo.ServerError
		if errors.As(err, &se) && se.HasErrorCode(26) { // NamespaceNotFound: no collection yet
			names, err = nil, nil
		}
		if err != nil {
			return err
		}
		have := map[string]bool{}
		for _, n := range names {
			have[n.Name] = true
		}
		for _, m := range models {
			var o options.IndexOptions
			for _, set := range m.Options.List() {
				_ = set(&o)
			}
			if o.Name != nil && have[*o.Name] {
				continue
			}
			if _, err := coll.Indexes().CreateOne(ctx, m); err != nil {
				return err
			}
		}
		return nil
	})
}

// Register registers fn as the handler of the jobs named name, whose
// argument is an A, and returns the Kind to enqueue them with: before Run,
// in every process that enqueues or runs them, under the same name with the
// same argument type. A nil Queue or fn, an empty name (or one over 100
// bytes), or a name registered already is an *InvalidError.
//
// fn runs once per attempt, on the worker that holds the job's key, with a
// context that ends when the attempt's time is up (Options.JobTimeout), when
// the worker loses its claim on the key, or when Run's context ends. A job
// may be delivered more than once, so fn's writes must apply once: use
// Guarded or Modify, or add Job.Fence and Job.Stamp to your own conditional
// write. fn returns nil when done, an error to fail the attempt (retried
// with backoff until MaxAttempts), retry.Permanent(err) to make the job
// dead at once, or Snooze(d) to run it again later without counting the
// attempt. A panic fails the attempt.
func Register[A any](q *Queue, name string, fn func(ctx context.Context, job *Job, args A) error) (*Kind[A], error) {
	return register(q, name, fn, nil)
}

func register[A any](q *Queue, name string, fn func(context.Context, *Job, A) error, batch func(context.Context, []*Job) (int, error)) (*Kind[A], error) {
	if q == nil || fn == nil {
		return nil, invalid("register", "handler", "nil Queue or function", nil)
	}
	h := &handler{name: name, typ: reflect.TypeFor[A](), run: func(ctx context.Context, job *Job) error {
		var a A
		if err := job.Args.Unmarshal(&a); err != nil {
			return argsError(job, reflect.TypeFor[A](), err)
		}
		return fn(ctx, job, a)
	}, batch: batch}
	if err := q.register(h); err != nil {
		return nil, err
	}
	return &Kind[A]{q: q, h: h}, nil
}

func (q *Queue) register(h *handler) error {
	if h.name == "" || len(h.name) > 100 || strings.TrimSpace(h.name) != h.name {
		return invalid("register", "name", fmt.Sprintf("%q: want 1 to 100 bytes, no surrounding spaces", h.name), nil)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.handlers[h.name]; ok {
		return invalid("register", "name", fmt.Sprintf("%q is registered already", h.name), nil)
	}
	q.handlers[h.name] = h
	return nil
}

func (q *Queue) handler(name string) *handler {
	q.mu.RLock()
	defer q.mu.RUnlock()
	return q.handlers[name]
}

// Kind is a registered handler, with the type of its argument: enqueue its
// jobs with Enqueue.
type Kind[A any] struct {
	q *Queue
	h *handler
}

// Name returns the handler's name.
func (k *Kind[A]) Name() string { return k.h.name }

// Enqueue stores a job of this kind on key with args and returns its id.
// See Queue.Enqueue.
func (k *Kind[A]) Enqueue(ctx context.Context, key any, args A) (bson.ObjectID, error) {
	return k.q.enqueue(ctx, k.h, key, args)
}

// Enqueue stores a job for the handler registered as name, on key, with
// args (of the handler's argument type), and returns its id. Jobs with the
// same key run one at a time, in the order their Enqueue calls returned.
//
// It costs two round trips (four for a key's first): a findOneAndUpdate of
// the key's document reserves the key's next sequence number, an insert
// stores the job. Inside a transaction (ctx carries a session with one in
// progress) both take part in it. An error other than an
// *UnknownOutcomeError means the job is not stored and will not be; after a
// write that may have landed, the answer is the id or an
// *UnknownOutcomeError with the id, also when ctx ended meanwhile. A number
// reserved by an enqueuer that died before its insert is skipped after
// Options.HoleTimeout.
//
// Bad input is refused before anything is written, with an *InvalidError: a
// nil ctx, a name no handler is registered under, args that are not of the
// handler's type, that do not encode, hold a field name starting with '$' or
// containing '.', or exceed 15 MiB, and a key that store.CheckID refuses
// (matching ErrInvalidID).
func (q *Queue) Enqueue(ctx context.Context, name string, key any, args any) (bson.ObjectID, error) {
	h := q.handler(name)
	if h == nil {
		if err := checkCtx(ctx, "enqueue"); err != nil {
			return bson.ObjectID{}, err
		}
		return bson.ObjectID{}, invalid("enqueue", "name", fmt.Sprintf("no handler is registered as %q", shorten(name)), nil)
	}
	if args != nil && reflect.TypeOf(args) != h.typ {
		return bson.ObjectID{}, invalid("enqueue", "args", fmt.Sprintf("%s takes a %v, not a %T", h.name, h.typ, args), nil)
	}
	return q.enqueue(ctx, h, key, args)
}

// maxArgs bounds the encoded argument, below the 16 MiB document limit.
const maxArgs = 15 << 20

// maxEnqueueTries bounds the reservations of one Enqueue whose numbers were skipped.
const maxEnqueueTries = 5

func (q *Queue) enqueue(ctx context.Context, h *handler, key any, args any) (bson.ObjectID, error) {
	var none bson.ObjectID
	if err := checkCtx(ctx, "enqueue"); err != nil {
		return none, err
	}
	raw, err := store.CheckID(key)
	if err != nil {
		return none, invalid("enqueue", "key", "refused", err)
	}
	t, b, err := bson.MarshalValue(args)
	if err != nil {
		return none, invalid("enqueue", "args", "they do not encode to BSON", err)
	}
	arg := bson.RawValue{Type: t, Value: b}
	if err := checkArgs(arg); err != nil {
		return none, invalid("enqueue", "args", err.Error(), nil)
	}
	if _, err := q.EnsureIndexes(ctx); err != nil {
		return none, err
	}
	id := bson.NewObjectID()
	inTx := settle.InTransaction(ctx)
	for try := 1; ; try++ {
		reserved := q.local.Now()
		// key is the key as its document stores it: a number equal to
		// another of another type names one key, whose places are made of
		// the stored one.
		seq, key, err := q.reserve(ctx, raw)
		if err != nil {
			return none, fmt.Errorf("deferred: enqueue %s on key %s: reserve a sequence number: %w", h.name, keyText(raw), err)
		}
		doc := bson.D{
			{Key: "_id", Value: id}, {Key: "k", Value: raw}, {Key: "s", Value: seq}, {Key: "p", Value: placeOf(key, seq)}, {Key: "name", Value: h.name},
			{Key: "args", Value: arg}, {Key: "state", Value: StateAvailable}, {Key: "attempt", Value: 0},
			{Key: "max", Value: q.c.MaxAttempts}, {Key: "enqueued", Value: q.local.Now()},
		}
		stored, err := q.place(ctx, "enqueue", key, seq, id, q.inserted(doc))
		var unknown *UnknownOutcomeError
		late := false
		switch {
		case errors.As(err, &unknown):
			return none, err // it names the job and the operation
		case err != nil:
			return none, fmt.Errorf("deferred: enqueue %s on key %s: %w", h.name, keyText(raw), err)
		case stored && !inTx && q.local.Now().Sub(reserved) >= q.c.HoleTimeout/2:
			// The number may have been skipped meanwhile (landedLate).
			if late, err = q.landedLate(ctx, key, id, seq, nil); err != nil {
				return none, &UnknownOutcomeError{Pkg: "deferred", Op: "enqueue", ID: id, Subject: "job " + id.Hex(), Err: fmt.Errorf("check a slow insert: %w", err)}
			}
		}
		if stored && !late {
			q.notify()
			q.jobEvent(ctx, observe.JobEnqueued, opEnqueue, &Job{ID: id, Key: raw, Name: h.name})
			return id, nil
		}
		if try >= maxEnqueueTries {
			return none, fmt.Errorf("deferred: enqueue %s on key %s: the key skipped %d numbers reserved for this job (Options.HoleTimeout too short?)", h.name, keyText(raw), try)
		}
		// The number was skipped, or the job taken back: reserve another.
	}
}

// landedLate reports whether the job id, whose slow write (an insert, or
// Requeue's update) put it at seq on key, landed behind the key's head, and
// then takes it back: deletes it (restore nil) or applies restore, and
// writes the number's tombstone. It settles on a context of its own
// (settling). An error means it could not tell. See DESIGN.md, Holes.
func (q *Queue) landedLate(ctx context.Context, raw bson.RawValue, id bson.ObjectID, seq int64, restore bson.D) (bool, error) {
	ctx, cancel := q.settling(ctx)
	defer cancel()
	late, err := q.passed(ctx, raw, seq)
	if err == nil && late {
		late, err = q.takeBack(ctx, id, seq, restore)
	}
	if err != nil || !late {
		return false, err
	}
	q.abandon(ctx, raw, seq)
	return true, nil
}

// settling returns a context for settling a write the caller's answer
// depends on: ctx's values, no session, deadline or cancellation, and
// ResolveTimeout.
func (q *Queue) settling(ctx context.Context) (context.Context, context.CancelFunc) {
	return settle.Detached(store.NoSession(ctx), q.c.ResolveTimeout)
}

// passed reports whether the head of key (read from the primary, retried)
// has moved past seq: a job that just landed there, still available, landed
// late.
func (q *Queue) passed(ctx context.Context, raw bson.RawValue, seq int64) (bool, error) {
	kd, err := settle.Reread(ctx, q.settleConfig(), func(ctx context.Context) (*keyDoc, error) { return q.readKey(ctx, raw, false) })
	return kd != nil && kd.Off+kd.Done >= seq, err
}

// takeBack deletes the job id (update nil), or applies update, if it is
// still available at seq, and reports whether it did. A lost reply is
// judged by the job at majority: gone or moved off seq, done; available at
// seq, live; else a worker or Cancel has it.
func (q *Queue) takeBack(ctx context.Context, id bson.ObjectID, seq int64, update bson.D) (bool, error) {
	filter := bson.D{{Key: "_id", Value: id}, {Key: "s", Value: seq}, {Key: "state", Value: StateAvailable}}
	res, err := settle.Exec(ctx, q.settleConfig(), settle.Write[struct{}, *Job]{
		Send: q.updated(q.jobs, filter, update, 1),
		Read: func(ctx context.Context) (*Job, error) { return q.settledJob(ctx, bson.D{{Key: "_id", Value: id}}) },
		Judge: func(job *Job) (settle.Verdict, string) {
			return verdict(job == nil || job.Seq != seq, job != nil && job.State == StateAvailable)
		},
		Resend: true,
	})
	return res.Applied, err
}

// settleConfig is how the package uses the settling engine.
func (q *Queue) settleConfig() settle.Config {
	return settle.Config{Retry: q.c.Retry, ResolveTimeout: q.c.ResolveTimeout}
}

// majority returns the majority readers of the jobs and keys collections.
func (q *Queue) majority() (jobs, keys *settle.Majority) {
	q.maj.once.Do(func() { q.maj.jobs, q.maj.keys = settle.NewMajority(q.jobs), settle.NewMajority(q.keys) })
	return q.maj.jobs, q.maj.keys
}

// settledJob reads at majority the job that matches filter: nil when there
// is none.
func (q *Queue) settledJob(ctx context.Context, filter bson.D) (*Job, error) {
	jobs, _ := q.majority()
	job := new(Job)
	return found(job, jobs.Read(ctx, func(c *mongo.Collection) error { return c.FindOne(ctx, filter).Decode(job) }))
}

// settledJobs reads at majority the jobs with ids.
func (q *Queue) settledJobs(ctx context.Context, ids bson.A) ([]Job, error) {
	jobs, _ := q.majority()
	var out []Job
	return out, jobs.Read(ctx, func(c *mongo.Collection) error {
		cur, err := c.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
		if err != nil {
			return err
		}
		out = nil
		return cur.All(ctx, &out)
	})
}

// holder reads at majority the id of what holds seq on key raw, a job or a
// tombstone (zero: nothing).
func (q *Queue) holder(ctx context.Context, raw bson.RawValue, seq int64) (id bson.ObjectID, err error) {
	job, err := q.settledJob(ctx, at(raw, seq))
	if job != nil {
		id = job.ID
	}
	return id, err
}

// at matches the job (or tombstone) at seq on key raw.
func at(raw bson.RawValue, seq int64) bson.D {
	return bson.D{{Key: "p", Value: placeOf(raw, seq)}}
}

// placeOf is a job's place, its field p: key raw and number seq in one
// string, unique (the index deferred_place), and ordered by seq among the
// places of one key: the key's type and bytes in hex, a colon, seq in 16
// hex digits (DESIGN.md, Places). raw must be the key as its document
// stores it.
func placeOf(raw bson.RawValue, seq int64) string {
	return hex.EncodeToString(append([]byte{byte(raw.Type)}, raw.Value...)) + fmt.Sprintf(":%016x", seq) // seq > 0: off is a time in µs
}

// verdict is the engine's verdict on a read: landed, else live, else dead.
func verdict(landed, live bool) (settle.Verdict, string) {
	switch {
	case landed:
		return settle.Landed, ""
	case live:
		return settle.Live, ""
	}
	return settle.Dead, ""
}

// holds judges a write that puts the thing id at a place of a key from the
// id of what holds the place (the unique index on places gives it to one).
func holds(id bson.ObjectID) func(bson.ObjectID) (settle.Verdict, string) {
	return func(h bson.ObjectID) (settle.Verdict, string) { return verdict(h == id, h.IsZero()) }
}

// place sends, through the settling engine, the write that puts the job id
// at seq on key raw (Enqueue's insert, Requeue's update); applied false
// means the place is taken, or the update matched nothing. A lost reply is
// judged by what holds the place at majority, and resent while nothing
// does. Its answers are honest: false, or an error other than an
// *UnknownOutcomeError, means no copy of the write can apply any more (the
// number gets a tombstone where that is not yet sure). See DESIGN.md.
func (q *Queue) place(ctx context.Context, op string, raw bson.RawValue, seq int64, id bson.ObjectID, send func(context.Context) (struct{}, bool, error)) (bool, error) {
	res, err := settle.Exec(ctx, q.settleConfig(), settle.Write[struct{}, bson.ObjectID]{
		Send: send, Read: func(ctx context.Context) (bson.ObjectID, error) { return q.holder(ctx, raw, seq) }, Judge: holds(id), Resend: true,
	})
	var ue *settle.UnknownError
	switch {
	case err == nil && res.Applied:
		return true, nil
	case err == nil && res.HasRead:
		return false, nil // the place is taken
	case err != nil && !errors.As(err, &ue):
		if !settle.InTransaction(ctx) {
			q.abandon(ctx, raw, seq)
		}
		return false, err
	}
	// Refused at once, or not settled: the tombstone tells.
	landed, serr := q.settle(ctx, raw, seq, id)
	switch {
	case serr != nil:
		return false, &UnknownOutcomeError{Pkg: "deferred", Op: op, ID: id, Subject: "job " + id.Hex(), Err: errors.Join(err, serr)}
	case landed || ue == nil:
		return landed, nil
	}
	return false, ue.Err
}

// settle decides whether the write that puts the job id at seq landed when
// the engine could not tell, by inserting the number's tombstone: landed,
// the write cannot land any more; refused, what holds the number tells. An
// error leaves the outcome unknown. It runs on the settling context.
func (q *Queue) settle(ctx context.Context, raw bson.RawValue, seq int64, id bson.ObjectID) (landed bool, err error) {
	ctx, cancel := q.settling(ctx)
	defer cancel()
	read := func(ctx context.Context) (bson.ObjectID, error) { return q.holder(ctx, raw, seq) }
	doc, tid := q.tombstoneDoc(ctx, raw, seq)
	res, err := settle.Exec(ctx, q.settleConfig(), settle.Write[struct{}, bson.ObjectID]{
		Send: q.inserted(doc), Read: read, Judge: holds(tid), Resend: true,
	})
	switch {
	case err != nil:
		return false, fmt.Errorf("write the tombstone of its number: %w", err)
	case res.Applied:
		return false, nil
	}
	h := res.Read
	if !res.HasRead {
		h, err = settle.Reread(ctx, q.settleConfig(), read)
	}
	if err == nil && h.IsZero() {
		err = errors.New("the number's tombstone was refused, and nothing holds the number")
	}
	return h == id, err
}

// reserve takes the next sequence number of key: one findOneAndUpdate of
// the key's document that sets a fresh reservation id r (the key's first
// reservation makes the document first). A lost reply is judged by r on the
// document at majority; it is never resent as it is (each copy would take a
// number): it reserves again, and a number it may have taken is a hole.
func (q *Queue) reserve(ctx context.Context, raw bson.RawValue) (int64, bson.RawValue, error) {
	var last error
	for try, creates := 1, 0; try <= 5; try++ {
		rid := bson.NewObjectID()
		update := bson.D{
			{Key: "$inc", Value: bson.D{{Key: "tail", Value: int64(1)}, {Key: "n", Value: int64(1)}}},
			{Key: "$set", Value: bson.D{{Key: "r", Value: rid}}},
		}
		res, err := settle.Exec(ctx, q.settleConfig(), settle.Write[*keyDoc, *keyDoc]{
			Send:  modified[keyDoc](q, q.keys, store.IDFilter(raw), update, options.After),
			Read:  func(ctx context.Context) (*keyDoc, error) { return q.readKey(ctx, raw, true) },
			Judge: func(kd *keyDoc) (settle.Verdict, string) { return verdict(kd != nil && kd.R == rid, true) },
		})
		var ue *settle.UnknownError
		switch {
		case err == nil && res.Applied:
			kd := shown(res)
			return kd.Off + kd.Tail, kd.ID, nil
		case err == nil && res.HasReply && creates < 3:
			// No key document: make it and reserve again.
			creates++
			try--
			if err := q.createKey(ctx, raw); err != nil {
				return 0, raw, err
			}
		case err == nil && res.HasReply:
			return 0, raw, fmt.Errorf("the key's document was still missing after %d inserts of it (deleted meanwhile?)", creates)
		case err == nil, errors.As(err, &ue):
			// Not shown, or not settled: reserve again.
			last = errors.New("the reservation's reply was lost, and re-reading the key did not show it")
			if err != nil {
				last = ue
			}
			if cerr := store.ContextError(ctx); cerr != nil {
				return 0, raw, errors.Join(last, cerr)
			}
		default:
			return 0, raw, err
		}
	}
	return 0, raw, last
}

// createKey inserts the document of a key that has none; it is there
// afterwards, whoever made it. An insert, not an upsert: FerretDB v2 runs
// concurrent upserts of one new _id as separate inserts (DESIGN.md).
func (q *Queue) createKey(ctx context.Context, raw bson.RawValue) error {
	doc := bson.D{
		{Key: "_id", Value: raw},
		// Above the numbers of a deleted document of the key: DESIGN.md, Bounds.
		{Key: "off", Value: q.now(ctx).UnixMicro()},
		{Key: "tail", Value: int64(0)}, {Key: "done", Value: int64(0)}, {Key: "n", Value: int64(0)},
	}
	err := q.try(ctx, func(ctx context.Context) error { _, err := q.keys.InsertOne(ctx, doc); return err })
	if !settle.InTransaction(ctx) && (store.IsDuplicateKey(err) || store.IsAmbiguous(err)) {
		return nil // there, or perhaps there: the next reservation tells
	}
	return err // in a transaction, its owner retries it whole
}

// abandon writes, best effort, the tombstone of a number whose insert
// surely failed, so that its key need not wait HoleTimeout.
func (q *Queue) abandon(ctx context.Context, raw bson.RawValue, seq int64) {
	ctx, cancel := q.settling(ctx)
	defer cancel()
	if err := q.tombstone(ctx, raw, seq); err != nil && !store.IsDuplicateKey(err) {
		q.failed(ctx, "skip_number", raw, err)
	}
}

// tombstone inserts the tombstone of seq on key; a copy after a lost reply
// fails on the unique index, which means "there".
func (q *Queue) tombstone(ctx context.Context, raw bson.RawValue, seq int64) error {
	doc, _ := q.tombstoneDoc(ctx, raw, seq)
	_, _, err := q.inserted(doc)(ctx)
	return err
}

// tombstoneDoc returns the tombstone of seq on key, kept an hour at least
// (DESIGN.md, Holes), and its id.
func (q *Queue) tombstoneDoc(ctx context.Context, raw bson.RawValue, seq int64) (bson.D, bson.ObjectID) {
	now, id := q.now(ctx), bson.NewObjectID()
	return bson.D{
		{Key: "_id", Value: id}, {Key: "k", Value: raw}, {Key: "s", Value: seq}, {Key: "p", Value: placeOf(raw, seq)},
		{Key: "state", Value: stateSkipped}, {Key: "finished", Value: now},
		{Key: "expireAt", Value: now.Add(max(q.c.Retention, time.Hour))},
	}, id
}

// inserted is the send of an insert of doc into the jobs collection:
// refused on a unique index, not applied.
func (q *Queue) inserted(doc bson.D) func(context.Context) (struct{}, bool, error) {
	return func(ctx context.Context) (struct{}, bool, error) {
		err := q.try(ctx, func(ctx context.Context) error { _, err := q.jobs.InsertOne(ctx, doc); return err })
		if store.IsDuplicateKey(err) {
			return struct{}{}, false, nil
		}
		return struct{}{}, err == nil, err
	}
}

// updated updates (an empty update: deletes) the want documents of coll
// that match filter: applied when it matched them all.
func (q *Queue) updated(coll *mongo.Collection, filter, update bson.D, want int64) func(context.Context) (struct{}, bool, error) {
	return func(ctx context.Context) (struct{}, bool, error) {
		var n int64
		err := q.try(ctx, func(ctx context.Context) error {
			var res *mongo.UpdateResult
			var err error
			switch {
			case len(update) == 0:
				var d *mongo.DeleteResult
				if d, err = coll.DeleteOne(ctx, filter); err == nil {
					n = d.DeletedCount
				}
				return err
			case want == 1:
				res, err = coll.UpdateOne(ctx, filter, update)
			default:
				res, err = coll.UpdateMany(ctx, filter, update)
			}
			if err == nil {
				n = res.MatchedCount
			}
			return err
		})
		return struct{}{}, err == nil && n == want, err
	}
}

// modified runs findOneAndUpdate on coll, and returns the document before
// or after the update (rd); nil when none matched.
func modified[T any](q *Queue, coll *mongo.Collection, filter, update bson.D, rd options.ReturnDocument) func(context.Context) (*T, bool, error) {
	return func(ctx context.Context) (*T, bool, error) {
		var v T
		err := q.try(ctx, func(ctx context.Context) error {
			return coll.FindOneAndUpdate(ctx, filter, update, options.FindOneAndUpdate().SetReturnDocument(rd)).Decode(&v)
		})
		if errors.Is(err, mongo.ErrNoDocuments) {
			return nil, false, nil
		}
		return &v, err == nil, err
	}
}

// readKey reads a key's document (nil: none), at majority when settled.
func (q *Queue) readKey(ctx context.Context, raw bson.RawValue, settled bool) (*keyDoc, error) {
	kd := new(keyDoc)
	read := func(c *mongo.Collection) error { return c.FindOne(ctx, store.IDFilter(raw)).Decode(kd) }
	if _, keys := q.majority(); settled {
		return found(kd, keys.Read(ctx, read))
	}
	return found(kd, read(q.keys))
}

// shown returns what shows that a write landed: its reply, or else the
// read that settled it.
func shown[T any](res settle.Result[*T, *T]) *T {
	if res.HasReply {
		return res.Reply
	}
	return res.Read
}

// found returns v, or nil when err says no document was found, or err.
func found[T any](v *T, err error) (*T, error) {
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil //nolint:nilnil // no document is an answer, which the judges judge
	}
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (q *Queue) notify() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// now returns the server's time as the Clock estimates it, or the local
// time without an estimate: it dates retries, holes and clean-up, never a
// decision of safety.
func (q *Queue) now(ctx context.Context) time.Time {
	est, err := q.leases.Clock().Now(ctx)
	if err != nil || est.Time.IsZero() {
		return q.local.Now()
	}
	return est.Time
}

// checkArgs refuses an encoded argument that a server could read as an
// operator, or that is too large.
func checkArgs(v bson.RawValue) error {
	if len(v.Value) > maxArgs {
		return fmt.Errorf("%d bytes encoded, over %d", len(v.Value), maxArgs)
	}
	return walkArgs(v, 0)
}

func walkArgs(v bson.RawValue, depth int) error {
	if depth > 100 {
		return errors.New("nested more than 100 levels deep")
	}
	var vals []bson.RawValue
	switch v.Type {
	case bson.TypeEmbeddedDocument:
		elems, _ := v.Document().Elements()
		for _, e := range elems {
			if k := e.Key(); strings.HasPrefix(k, "$") || strings.Contains(k, ".") {
				return fmt.Errorf("field name %q starts with '$' or contains '.'", shorten(k))
			}
			vals = append(vals, e.Value())
		}
	case bson.TypeArray:
		vals, _ = v.Array().Values()
	default: // a scalar holds no field name
	}
	for _, x := range vals {
		if err := walkArgs(x, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// checkCtx refuses a nil ctx with an *InvalidError and returns an ended
// ctx's error, wrapped.
func checkCtx(ctx context.Context, op string) error {
	if err := store.CheckContext(ctx); err != nil {
		if ctx == nil {
			return invalid(op, "context", "nil", err)
		}
		return fmt.Errorf("deferred: %s: %w", op, err)
	}
	return nil
}

// shorten cuts s to 64 bytes for a message.
func shorten(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// try runs op under retry.Do and Options.Retry, which retry an operation
// that was not sent; an ambiguous failure is returned at once, for
// settle.Exec. Inside a transaction op runs once.
func (q *Queue) try(ctx context.Context, op func(context.Context) error) error {
	if settle.InTransaction(ctx) {
		return op(ctx)
	}
	return retry.Do(ctx, q.c.Retry, func(ctx context.Context) error {
		err := op(ctx)
		if store.IsAmbiguous(err) {
			return retry.Permanent(err)
		}
		return err
	})
}

// sleep waits d on the queue's local clock, or until ctx ends.
func (q *Queue) sleep(ctx context.Context, d time.Duration) {
	t := q.local.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
}

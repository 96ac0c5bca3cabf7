package deferred

import (
	"context"
	"crypto/rand"
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
	// oneScan: the server finds a document by its _id only for a filter of
	// the _id alone, and scans the collection for any other (FerretDB v1):
	// an update of several jobs is then one scan (eachJob).
	oneScan atomic.Bool
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
	// The lease's Now only when the caller gave a clock: with one set, the
	// lease makes a server clock of its own instead of the client's shared one.
	var now func() time.Time
	if opts != nil && opts.LocalClock != nil {
		now = c.LocalClock.Now
	}
	leases, err := lease.New(keys, &lease.Options{
		TTL: c.VisibilityTimeout, Owner: c.Owner, Mode: c.LeaseMode, Clock: c.Clock, ResolveTimeout: c.ResolveTimeout,
		Observer: c.Observer, Now: now,
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
	q.oneScan.Store(caps.Server == store.FerretDBv1)
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

// RegisterRun registers fn as Register does, and run, which a worker calls
// instead of fn with a run of two or more due jobs of one key and this
// name (at most Options.Batch), claimed together, in enqueue order. run
// returns how many of the run's first jobs it completed, which are
// recorded completed together (the count decides: an error returned with
// all of them counted is ignored), and for the others either ErrOneByOne
// (or a nil error), to give them back unattempted, or an error, which
// fails the attempt of the first one not completed (the rest go back,
// unattempted). Jobs given back come to run again in the next run; when
// it returns (0, ErrOneByOne), the run's first job goes to fn alone, and
// the rest to run again: a run function takes what it can do whole and
// leaves the rest to fn. A worker that loses its claim on the key while
// run runs records the jobs run completed, gives back those that wrote
// nothing, and leaves the others to the key's next holder.
//
// run's writes must be fenced for the whole run: GuardedRun is fenced on
// the first job and stamped with the last, so that no copy of it lands
// after any job of the run, or of an earlier one, has been applied. A
// job taken over from a worker that lost its claim, or at its last
// attempt, runs alone (fn); a job whose attempt failed may head a run
// again. An error from fn that matches ErrOneByOne is an error like any
// other: it fails the attempt. A count below 0 or above the run's length
// is an *InvalidError, which makes the run's first job dead.
func RegisterRun[A any](q *Queue, name string, fn func(ctx context.Context, job *Job, args A) error, run func(ctx context.Context, jobs []*Job) (int, error)) (*Kind[A], error) {
	if run == nil {
		return nil, invalid("register", "handler", "nil run function", nil)
	}
	return register(q, name, fn, run)
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

// settling returns a context for settling a write the caller's answer
// depends on: ctx's values, no session, deadline or cancellation, and
// ResolveTimeout.
func (q *Queue) settling(ctx context.Context) (context.Context, context.CancelFunc) {
	return settle.Detached(store.NoSession(ctx), q.c.ResolveTimeout)
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

// majorityJob reads at majority the job that matches filter: nil when there
// is none.
func (q *Queue) majorityJob(ctx context.Context, filter bson.D) (*Job, error) {
	jobs, _ := q.majority()
	job := new(Job)
	return found(job, jobs.Read(ctx, func(c *mongo.Collection) error { return c.FindOne(ctx, filter).Decode(job) }))
}

// majorityJobs reads at majority the jobs with ids.
func (q *Queue) majorityJobs(ctx context.Context, ids bson.A) ([]Job, error) {
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

// updated updates (an empty update: deletes) the document of coll that
// filter names: applied when it matched it.
func (q *Queue) updated(coll *mongo.Collection, filter, update bson.D) func(context.Context) (struct{}, bool, error) {
	return func(ctx context.Context) (struct{}, bool, error) {
		var n int64
		err := q.try(ctx, func(ctx context.Context) error {
			if len(update) == 0 {
				d, err := coll.DeleteOne(ctx, filter)
				if err == nil {
					n = d.DeletedCount
				}
				return err
			}
			res, err := coll.UpdateOne(ctx, filter, update)
			if err == nil {
				n = res.MatchedCount
			}
			return err
		})
		return struct{}{}, err == nil && n == 1, err
	}
}

// updatedEach sends models, the update of n jobs (eachJob), in one command
// to the jobs collection: applied when each job matched.
func (q *Queue) updatedEach(models []mongo.WriteModel, n int) func(context.Context) (struct{}, bool, error) {
	return func(ctx context.Context) (struct{}, bool, error) {
		var matched int64
		err := q.try(ctx, func(ctx context.Context) error {
			res, err := q.jobs.BulkWrite(ctx, models)
			if err == nil {
				matched = res.MatchedCount
			}
			return err
		})
		return struct{}{}, err == nil && matched == int64(n), err
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

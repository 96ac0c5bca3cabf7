package deferred

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// Change is a named change to the documents of one versioned repository
// (NewChange): applied now through versioned's Modify or, when its retries
// run out, later from the queue, exactly once either way.
type Change[T, A any] struct {
	kind *Kind[A]
	repo *versioned.Repo[T]
	fn   func(doc *T, args A) error
}

// Result is what Change.ModifyOrEnqueue did.
type Result[T any] struct {
	// Doc is the document as stored after the change, applied now.
	Doc *T
	// Queued is true when the change was enqueued instead: it runs later,
	// exactly once. A service answers 202 Accepted with JobID to poll.
	Queued bool
	// JobID is the id of the queued job.
	JobID bson.ObjectID
	// Cause is Modify's error that made it queue (see Exhausted).
	Cause error
}

// NewChange registers, under name, the change fn to the documents of repo:
// fn(doc, args) edits the document in place, as a versioned Modify
// function does, and may run several times (on conflicts, on later
// attempts), so it must have no side effects. The job's key is the
// document's id. A worker applies a run of a document's queued changes in
// one Modify (one read, one write): fn runs for each in order on one copy,
// and the write carries the stamp of the last; a change applied alone goes
// through the Modify helper. fn's error fails that job's attempt (the
// changes before it are applied without it); retry.Permanent(err) makes
// it dead at once. Errors are those of Register.
func NewChange[T, A any](q *Queue, name string, repo *versioned.Repo[T], fn func(doc *T, args A) error) (*Change[T, A], error) {
	if repo == nil || fn == nil {
		return nil, invalid("register", "change", "nil repository or function", nil)
	}
	idType, ok := idTypeOf(reflect.TypeFor[T]())
	if !ok {
		return nil, invalid("register", "change", fmt.Sprintf("%v maps no field to _id", reflect.TypeFor[T]()), nil)
	}
	c := &Change[T, A]{repo: repo, fn: fn}
	docID := func(job *Job) (any, error) {
		id := reflect.New(idType)
		if err := job.Key.Unmarshal(id.Interface()); err != nil {
			return nil, retry.Permanent(fmt.Errorf("deferred: job %s: decode its key as the %v id of %v: %w", job.ID.Hex(), idType, reflect.TypeFor[T](), err))
		}
		return id.Elem().Interface(), nil
	}
	k, err := register(q, name, func(ctx context.Context, job *Job, args A) error {
		id, err := docID(job)
		if err != nil {
			return err
		}
		_, err = Modify(ctx, job, repo, id, func(doc *T) error { return fn(doc, args) })
		return err
	}, func(ctx context.Context, jobs []*Job) (int, error) {
		id, err := docID(jobs[0])
		if err != nil {
			return 0, err
		}
		return c.applyRun(ctx, jobs, id)
	})
	if err != nil {
		return nil, err
	}
	c.kind = k
	return c, nil
}

// errOneByOne says a run must be taken one job at a time: the document
// carries the stamp of one of them, or an argument does not decode.
var errOneByOne = ErrOneByOne

// applyRun applies a run of jobs of the document id in one versioned Modify,
// fenced on the first job's number and stamped with the last one's (whole
// or not at all). It returns how many it applied and, when fewer than all,
// the error of the first one not applied: when fn fails on a job, the jobs
// before it are applied without it, from a fresh read.
func (c *Change[T, A]) applyRun(ctx context.Context, jobs []*Job, id any) (int, error) {
	args := make([]A, len(jobs))
	n, rest := len(jobs), error(nil)
	for i, job := range jobs {
		if err := job.Args.Unmarshal(&args[i]); err != nil {
			n, rest = i, errOneByOne
			break
		}
	}
	for n > 0 {
		first := jobs[0]
		failed, fnErr := 0, error(nil)
		_, err := c.repo.Modify(ctx, id, func(d *T) error {
			for failed = range n {
				// A panic is this job's failure, not the run's first job's.
				func() {
					defer recoverPanic(&fnErr)
					fnErr = c.fn(d, args[failed])
				}()
				if fnErr != nil {
					return fnErr
				}
			}
			return nil
		}, append(first.where(), versioned.WithSet(jobs[n-1].stamp()), versioned.WithRetry(first.q.c.Retry))...)
		switch {
		case err == nil:
			for _, job := range jobs[:n] {
				job.att.mayHaveWritten()
			}
			return n, rest
		case fnErr != nil && errors.Is(err, fnErr):
			n, rest = failed, fnErr
			continue
		case errors.Is(err, errApplied):
			return 0, errOneByOne
		case errors.Is(err, errStamps):
			return 0, first.stampsError("modify", first.Key)
		case errors.Is(err, store.ErrUnknownOutcome) || store.IsAmbiguous(err):
			for _, job := range jobs {
				job.att.mayHaveWritten()
			}
		}
		return 0, err
	}
	return 0, rest
}

// idTypeOf returns the type of the field of struct t mapped to "_id".
func idTypeOf(t reflect.Type) (reflect.Type, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil, false
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if name, _, _ := strings.Cut(f.Tag.Get("bson"), ","); name == "_id" && f.IsExported() {
			return f.Type, true
		}
	}
	return nil, false
}

// Kind returns the change's Kind.
func (c *Change[T, A]) Kind() *Kind[A] { return c.kind }

// Enqueue queues the change to the document with id without trying it now.
func (c *Change[T, A]) Enqueue(ctx context.Context, id any, args A) (bson.ObjectID, error) {
	return c.kind.Enqueue(ctx, id, args)
}

// ModifyOrEnqueue applies the change to the document with id now, with
// versioned.Repo.Modify, and, when Modify gives up on version conflicts
// (Exhausted: nothing was written), enqueues it on the document's key
// instead; the Result says which. Any other error of Modify (fn's own,
// ErrNotFound, an unknown outcome after which the change may have landed)
// is returned as it is, and nothing is queued. If the enqueue fails too,
// the error matches both.
//
// A change applied now does not wait for the changes queued on the same
// document before it: order holds among queued changes. A caller that needs
// every change in order after the first queued one calls Enqueue instead
// while the key has queued work.
func (c *Change[T, A]) ModifyOrEnqueue(ctx context.Context, id any, args A) (*Result[T], error) {
	if err := checkCtx(ctx, "modify or enqueue"); err != nil {
		return nil, err
	}
	doc, err := c.repo.Modify(ctx, id, func(d *T) error { return c.fn(d, args) })
	if err == nil {
		return &Result[T]{Doc: doc}, nil
	}
	if !Exhausted(err) {
		return nil, err
	}
	jobID, qerr := c.kind.Enqueue(ctx, id, args)
	if qerr != nil {
		return nil, fmt.Errorf("%w; and then: %w", err, qerr)
	}
	return &Result[T]{Queued: true, JobID: jobID, Cause: err}, nil
}

// Exhausted reports whether err is a versioned write that gave up on
// version conflicts, with nothing written: it matches versioned.ErrConflict
// and retry.ErrExhausted or retry.ErrBudgetExhausted. These are the errors
// ModifyOrEnqueue answers by queueing the change.
func Exhausted(err error) bool {
	return errors.Is(err, versioned.ErrConflict) &&
		(errors.Is(err, retry.ErrExhausted) || errors.Is(err, retry.ErrBudgetExhausted)) &&
		!errors.Is(err, versioned.ErrUnknownOutcome)
}

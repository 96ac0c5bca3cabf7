package deferred

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/canon"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// FenceField returns the path, in a target document, where Stamp records
// the sequence number of the last job of this job's queue and key applied
// to it: "<Options.FenceField>.k<hash of the queue and the key>". Numeric
// keys the server compares as equal (1, int64(1), 1.0) share one field.
func (j *Job) FenceField() string {
	h := sha256.New()
	h.Write([]byte(j.q.ns))
	k := canon.ID(j.Key)
	h.Write([]byte{0, byte(k.Type)})
	h.Write(k.Value)
	return j.q.c.FenceField + ".k" + hex.EncodeToString(h.Sum(nil)[:12])
}

// Fence returns the filter condition that holds on a target document while
// this job's change has not been applied to it: its stamp for the job's key
// is absent or below the job's sequence number. Add it to the filter of the
// job's conditional write, and Stamp to its $set, in the same statement:
// the write then applies at most once, however often the job is delivered
// and however many other writes the document takes, and never after a
// later job of the key.
//
//	filter := append(bson.D{{"_id", id}}, job.Fence()...)
//	update := bson.D{{"$inc", bson.D{{"balance", amount}}}, {"$set", bson.D{job.Stamp()}}}
//	res, err := coll.UpdateOne(ctx, filter, update)
//	// res.MatchedCount == 0: applied before (or no such document).
func (j *Job) Fence() bson.D {
	return bson.D{{Key: j.FenceField(), Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gte", Value: j.Seq}}}}}}
}

// Stamp returns the $set element that records this job as applied to a
// target document. A handler that calls it is taken to write with it: the
// job may have applied its change (Job.MayHaveApplied), which Requeue
// refuses.
func (j *Job) Stamp() bson.E {
	j.att.mayHaveWritten()
	return j.stamp()
}

// stamp is Stamp without the mark.
func (j *Job) stamp() bson.E { return bson.E{Key: j.FenceField(), Value: j.Seq} }

// attempt is what one delivery of a job did: the target documents written
// through Guarded and Modify, and whether a write may have landed.
type attempt struct {
	mu      sync.Mutex
	targets map[string]bool
	may     bool
}

// mayHaveWritten marks the attempt (nil: none) as one that may have written.
func (a *attempt) mayHaveWritten() {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.may = true
	a.mu.Unlock()
}

// wrote reports whether the attempt may have written.
func (a *attempt) wrote() bool {
	if a == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.may
}

// target reserves the attempt's write to the document rawID of coll and
// refuses a second one (it would find the first one's stamp and change
// nothing). done releases the reservation when the write surely did not
// land, and otherwise marks the attempt as one that may have written.
func (j *Job) target(op string, coll *mongo.Collection, rawID bson.RawValue) (done func(err error), err error) {
	a := j.att
	if a == nil {
		return func(error) {}, nil
	}
	id := canon.ID(rawID)
	t := coll.Database().Name() + "." + coll.Name() + "\x00" + string(rune(id.Type)) + string(id.Value)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.targets[t] {
		return nil, retry.Permanent(invalid(op, "target", fmt.Sprintf("job %s wrote the document %s of %s already: a job changes a document in one write (combine the updates into one)", j.ID.Hex(), keyText(rawID), coll.Name()), nil))
	}
	if a.targets == nil {
		a.targets = map[string]bool{}
	}
	a.targets[t] = true
	return func(err error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if err == nil || errors.Is(err, store.ErrUnknownOutcome) || store.IsAmbiguous(err) {
			a.may = true
			return
		}
		delete(a.targets, t)
	}, nil
}

// AppliedTo reports whether doc, a target document as read, carries the
// stamp of this job or of a later job of its key.
func (j *Job) AppliedTo(doc bson.Raw) bool {
	v, err := doc.LookupErr(strings.Split(j.FenceField(), ".")...)
	if err != nil {
		return false
	}
	n, ok := v.AsInt64OK()
	return ok && n >= j.Seq
}

// errApplied is the fence's WhereErr error: applied already.
var errApplied = errors.New("deferred: applied by an earlier attempt")

// errStamps is the stamps' bound's WhereErr error.
var errStamps = errors.New("deferred: too many stamps")

// where returns the conditions of a fenced write: the Fence and, where the
// server evaluates $expr, the stamps' bound (the key's stamp is there, or
// fewer than MaxStamps are).
func (j *Job) where() []versioned.WriteOption {
	opts := []versioned.WriteOption{versioned.WhereErr(j.Fence(), errApplied)}
	if j.q.expr.Load() {
		room := bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: j.FenceField(), Value: bson.D{{Key: "$exists", Value: true}}}},
			bson.D{{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{
				bson.D{{Key: "$size", Value: bson.D{{Key: "$objectToArray", Value: bson.D{{Key: "$ifNull", Value: bson.A{"$" + j.q.c.FenceField, bson.D{}}}}}}}},
				j.q.c.MaxStamps,
			}}}}},
		}}}
		opts = append(opts, versioned.WhereErr(room, errStamps))
	}
	return opts
}

// stampsError is the error of a fenced write refused by the stamps' bound.
func (j *Job) stampsError(op string, rawID bson.RawValue) error {
	return retry.Permanent(invalid(op, "target", fmt.Sprintf("the document %s carries %d stamps of this queue's keys (Options.MaxStamps): key the jobs that change one shared document by that document", keyText(rawID), j.q.c.MaxStamps), errStamps))
}

// Guarded applies the job's change to the document of repo with id, once:
// versioned.Repo.Guarded (cond and update in one statement) with the job's
// Fence added to the filter and its Stamp to the $set. When an earlier
// delivery applied it already, it changes nothing and returns the document
// as stored with a nil error, so a handler can return Guarded's error as its
// own. update must not write under Options.FenceField (an *InvalidError). A
// cond that does not hold is versioned's *GuardError: return
// retry.Permanent(err) to make the job dead at once, or err to try again
// later. With the repository's Options.ShardKey, id is a versioned.Key.
func Guarded[T any](ctx context.Context, job *Job, repo *versioned.Repo[T], id any, cond, update any) (*T, error) {
	if job == nil || job.q == nil || repo == nil {
		return nil, invalid("guarded", "job", "nil job or repository, or a job not from a Queue", nil)
	}
	return fenced(ctx, "guarded", job, job, repo, id, func(opts []versioned.WriteOption) (*T, error) {
		return repo.Guarded(ctx, id, cond, update, opts...)
	}, nil)
}

// GuardedRun applies one change for a whole run of jobs of one key (a run
// function's, RegisterRun) to the document of repo with id, once:
// versioned.Repo.Guarded with the first job's Fence in the filter and the
// last job's stamp in the $set. It applies only while no job of the run,
// nor any later job of the key, has been applied to the document, and
// none of its copies applies after that. When the document carries such a
// stamp already, it changes nothing and returns ErrOneByOne: some of the
// run was applied job by job, so return ErrOneByOne and let the handler
// take the jobs one at a time. Otherwise as Guarded: a cond that does not
// hold is versioned's *GuardError, a missing document ErrNotFound.
//
// jobs must be jobs the run function was handed, in order; jobs of another
// claim (read with Queue.Job, say) are an *InvalidError. The write stands
// for every job from the first to the last: a job between them left out
// whose change goes to the same document finds the stamp and applies
// nothing, so pass a prefix of the run, or jobs whose changes go
// elsewhere.
func GuardedRun[T any](ctx context.Context, jobs []*Job, repo *versioned.Repo[T], id any, cond, update any) (*T, error) {
	if len(jobs) == 0 || repo == nil {
		return nil, invalid("guarded_run", "jobs", "no jobs or a nil repository", nil)
	}
	first, last := jobs[0], jobs[len(jobs)-1]
	for i, job := range jobs {
		// The jobs a run function was handed: claimed together (one claim,
		// in this attempt), in order. A job read with Queue.Job, or one of
		// another run, would lend its stamp to jobs never applied.
		if job == nil || job.q == nil || job.att == nil || job.q != first.q || job.Claim.IsZero() || job.Claim != first.Claim ||
			!canon.Same(job.Key, first.Key) || i > 0 && job.Seq <= jobs[i-1].Seq {
			return nil, invalid("guarded_run", "jobs", "not the jobs of one run handed to a run function, in order", nil)
		}
	}
	doc, err := fenced(ctx, "guarded_run", first, last, repo, id, func(opts []versioned.WriteOption) (*T, error) {
		return repo.Guarded(ctx, id, cond, update, opts...)
	}, errOneByOne)
	if err == nil || errors.Is(err, errOneByOne) || errors.Is(err, store.ErrUnknownOutcome) || store.IsAmbiguous(err) {
		// The stamp found may be this run's own, from a copy whose reply
		// was lost: every job may have written.
		for _, job := range jobs {
			job.att.mayHaveWritten()
		}
	}
	return doc, err
}

// Modify applies fn's change to the document of repo with id, once:
// versioned.Repo.Modify (fn edits a fresh copy; the fields it changed are
// written; a conflict reads again and calls fn again) with the job's Fence
// in its filter, when it reads and when it writes, and its Stamp set in the
// same statement. When an earlier delivery applied it already, fn is not
// called and the document is returned as stored, with a nil error. If fn
// changes nothing, nothing is written. With the repository's
// Options.ShardKey, id is a versioned.Key.
//
// fn's error ends Modify without a write and is returned as it is (the
// attempt fails; retry.Permanent makes the job dead at once). fn must not
// change the id (an *InvalidError). Conflicts are retried under
// Options.Retry; when they run out the error matches versioned.ErrConflict
// and retry.ErrExhausted (or retry.ErrBudgetExhausted), and the next
// attempt starts from a fresh read.
func Modify[T any](ctx context.Context, job *Job, repo *versioned.Repo[T], id any, fn func(doc *T) error) (*T, error) {
	if job == nil || job.q == nil || repo == nil || fn == nil {
		return nil, invalid("modify", "job", "nil job, repository or function, or a job not from a Queue", nil)
	}
	return fenced(ctx, "modify", job, job, repo, id, func(opts []versioned.WriteOption) (*T, error) {
		var fnErr error
		doc, err := repo.Modify(ctx, id, func(d *T) error {
			fnErr = fn(d)
			return fnErr
		}, append(opts, versioned.WithRetry(job.q.c.Retry))...)
		if fnErr != nil && errors.Is(err, fnErr) {
			return nil, fnErr // as fn returned it, retry.Permanent included
		}
		return doc, err
	}, nil)
}

// fenced makes a helper's write with the fence, the stamps' bound and the
// stamp, within the target's reservation: "applied earlier" is the document
// as stored and a nil error.
// The write carries last's stamp (job's own, but for a run's). applied,
// if not nil, is returned, with no document, in place of the document as
// stored when the write finds the job applied already.
func fenced[T any](ctx context.Context, op string, job, last *Job, repo *versioned.Repo[T], id any, write func([]versioned.WriteOption) (*T, error), applied error) (*T, error) {
	bare := id
	if k, ok := id.(store.Key); ok {
		bare = k.ID
	}
	rawID, err := store.CheckID(bare)
	if err != nil {
		return nil, invalid(op, "id", "refused", err)
	}
	done, err := job.target(op, repo.Collection(), rawID)
	if err != nil {
		return nil, err
	}
	doc, err := write(append(job.where(), versioned.WithSet(last.stamp())))
	switch {
	case errors.Is(err, errApplied):
		done(nil)
		if applied != nil {
			return nil, applied
		}
		return repo.Get(ctx, id)
	case errors.Is(err, errStamps):
		err = job.stampsError(op, rawID)
	}
	done(err)
	return doc, err
}

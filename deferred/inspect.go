package deferred

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/store"
)

// Job reads the job with id. It returns a *NotFoundError when there is none
// (never enqueued, or deleted after its retention).
func (q *Queue) Job(ctx context.Context, id bson.ObjectID) (*Job, error) {
	if err := checkCtx(ctx, "job"); err != nil {
		return nil, err
	}
	job, err := q.readJob(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("deferred: job %s: %w", id.Hex(), err)
	}
	if job == nil || job.State == stateSkipped {
		return nil, &NotFoundError{ID: id}
	}
	return job, nil
}

func (q *Queue) readJob(ctx context.Context, id bson.ObjectID) (*Job, error) {
	job, _, err := q.readJobDoc(ctx, id)
	return job, err
}

// Counts returns how many jobs are in each state (every state present):
// one aggregation by state. Finished jobs count until their retention ends.
func (q *Queue) Counts(ctx context.Context) (map[State]int64, error) {
	if err := checkCtx(ctx, "counts"); err != nil {
		return nil, err
	}
	states := bson.A{}
	out := make(map[State]int64, len(States()))
	for _, s := range States() {
		states = append(states, s)
		out[s] = 0
	}
	cur, err := q.jobs.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "state", Value: bson.D{{Key: "$in", Value: states}}}}}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$state"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}},
	})
	if err != nil {
		return nil, fmt.Errorf("deferred: counts: %w", err)
	}
	var groups []struct {
		State State `bson:"_id"`
		N     int64 `bson:"n"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		return nil, fmt.Errorf("deferred: counts: %w", err)
	}
	for _, g := range groups {
		out[g.State] = g.N
	}
	return out, nil
}

// Requeue puts a dead or cancelled job back in the queue, with its attempts
// counted from zero again and its errors kept: it takes a new sequence
// number at the tail of its key, so it runs after the jobs enqueued on the
// key before the requeue. Any other state is a *StateError (matching
// ErrState); an unknown id a *NotFoundError. A job that may have applied
// its change (Job.MayHaveApplied) is refused with a *StateError whose
// MayHaveApplied is true: under a new sequence number its write would apply
// again. Check its target documents; then Cancel it, or enqueue what is
// missing as a new job.
//
// A Requeue that returns nil put the job back in the queue; one that
// returns an error other than an *UnknownOutcomeError (Op "requeue")
// changed nothing, and no copy of its write can change it later. A lost
// reply is settled as Enqueue's is.
func (q *Queue) Requeue(ctx context.Context, id bson.ObjectID) error {
	if err := checkCtx(ctx, "requeue"); err != nil {
		return err
	}
	if _, err := q.EnsureIndexes(ctx); err != nil {
		return err
	}
	inTx := settle.InTransaction(ctx)
	for try := 1; ; try++ {
		job, doc, err := q.readJobDoc(ctx, id)
		switch {
		case err != nil:
			return fmt.Errorf("deferred: requeue job %s: %w", id.Hex(), err)
		case job == nil || job.State == stateSkipped:
			return &NotFoundError{ID: id}
		case job.State != StateDead && job.State != StateCancelled:
			return &StateError{Op: "requeue", ID: id, State: job.State}
		case job.MayHaveApplied:
			return &StateError{Op: "requeue", ID: id, State: job.State, MayHaveApplied: true}
		}
		reserved := q.local.Now()
		seq, key, err := q.reserve(ctx, job.Key)
		if err != nil {
			return fmt.Errorf("deferred: requeue job %s: reserve a sequence number: %w", id.Hex(), err)
		}
		filter := bson.D{{Key: "_id", Value: id}, {Key: "state", Value: job.State}, {Key: "s", Value: job.Seq}}
		update := bson.D{
			// A new claim id: no copy of a claim of its earlier life can take it.
			{Key: "$set", Value: bson.D{{Key: "s", Value: seq}, {Key: "p", Value: placeOf(key, seq)}, {Key: "state", Value: StateAvailable}, {Key: "attempt", Value: 0}, {Key: claimField, Value: bson.NewObjectID()}}},
			{Key: "$unset", Value: bson.D{{Key: "finished", Value: ""}, {Key: "expireAt", Value: ""}, {Key: "runAt", Value: ""}}},
		}
		matched, err := q.place(ctx, "requeue", key, seq, id, q.updated(q.jobs, filter, update))
		var unknown *UnknownOutcomeError
		switch {
		case errors.As(err, &unknown):
			return err
		case err != nil:
			return fmt.Errorf("deferred: requeue job %s: %w", id.Hex(), err)
		}
		if matched {
			if !inTx && q.local.Now().Sub(reserved) >= q.c.HoleTimeout/2 {
				// As for a slow enqueue: put it back as it was, and again.
				late, err := q.landedLate(ctx, key, id, seq, restoreOf(job, doc))
				if err != nil {
					return &UnknownOutcomeError{Pkg: "deferred", Op: "requeue", ID: id, Subject: "job " + id.Hex(), Err: fmt.Errorf("check a slow update: %w", err)}
				}
				if late {
					if try >= 3 {
						return fmt.Errorf("deferred: requeue job %s: its new place on the key was skipped each time (Options.HoleTimeout too short?)", id.Hex())
					}
					continue
				}
			}
			q.notify()
			q.jobEvent(ctx, observe.JobRequeued, opRequeue, job)
			return nil
		}
		// Changed meanwhile: give the number up and look again.
		q.abandon(ctx, key, seq)
		if try >= 3 {
			return fmt.Errorf("deferred: requeue job %s: it keeps changing under this call", id.Hex())
		}
	}
}

// readJobDoc reads the job with id, decoded and as stored; nil when there
// is none.
func (q *Queue) readJobDoc(ctx context.Context, id bson.ObjectID) (*Job, bson.Raw, error) {
	var doc bson.Raw
	if err := q.jobs.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&doc); err != nil {
		_, err = found(&doc, err)
		return nil, nil, err
	}
	job := &Job{q: q}
	return job, doc, bson.Unmarshal(doc, job)
}

// restoreOf is the update that puts job, stored as doc, back as it was
// before Requeue's update (its number and place, state, attempt, finished,
// expireAt and runAt).
func restoreOf(job *Job, doc bson.Raw) bson.D {
	set := bson.D{{Key: "s", Value: job.Seq}, {Key: "state", Value: job.State}, {Key: "attempt", Value: job.Attempt}}
	unset := bson.D{}
	for _, f := range []string{"p", "finished", "expireAt", "runAt"} {
		if v, err := doc.LookupErr(f); err == nil {
			set = append(set, bson.E{Key: f, Value: v})
		} else {
			unset = append(unset, bson.E{Key: f, Value: ""})
		}
	}
	update := bson.D{{Key: "$set", Value: set}}
	if len(unset) > 0 {
		update = append(update, bson.E{Key: "$unset", Value: unset})
	}
	return update
}

// Cancel takes a job that is waiting (available or retryable) or dead out
// of the queue for good: it is marked cancelled, its key moves on without
// it, and it is deleted after the retention. A running or finished job is
// a *StateError; an unknown id a *NotFoundError. Cancel then clears, best
// effort, the hints that keep workers away from the key and wakes this
// process's Run. A lost reply is settled by re-reading the job; unsettled,
// it is an *UnknownOutcomeError.
func (q *Queue) Cancel(ctx context.Context, id bson.ObjectID) error {
	if err := checkCtx(ctx, "cancel"); err != nil {
		return err
	}
	now := q.now(ctx)
	filter := bson.D{{Key: "_id", Value: id}, {Key: "state", Value: bson.D{{Key: "$in", Value: bson.A{StateAvailable, StateRetryable, StateDead}}}}}
	update := bson.D{{Key: "$set", Value: bson.D{
		{Key: "state", Value: StateCancelled}, {Key: "finished", Value: now}, {Key: "expireAt", Value: now.Add(q.c.Retention)},
	}}}
	res, err := settle.Exec(ctx, q.settleConfig(), settle.Write[*Job, *Job]{
		Send: modified[Job](q, q.jobs, filter, update, options.Before),
		Read: func(ctx context.Context) (*Job, error) { return q.majorityJob(ctx, bson.D{{Key: "_id", Value: id}}) },
		Judge: func(job *Job) (settle.Verdict, string) {
			return verdict(job != nil && job.State == StateCancelled, job != nil && (!finished(job.State) && job.State != StateRunning || job.State == StateDead))
		},
		Resend: true,
		Unknown: func(_ *Job, _ bool, reason string, err error) error {
			return &UnknownOutcomeError{Pkg: "deferred", Op: "cancel", ID: id, Subject: "job " + id.Hex(), Reason: reason, Err: err}
		},
	})
	var unknown *UnknownOutcomeError
	switch {
	case errors.As(err, &unknown):
		return err
	case err != nil:
		return fmt.Errorf("deferred: cancel job %s: %w", id.Hex(), err)
	case res.Applied:
		job := shown(res)
		q.freeKey(ctx, job.Key)
		q.jobEvent(ctx, observe.JobCancelled, opCancel, job)
		return nil
	}
	cur, err := q.readJob(ctx, id)
	switch {
	case err != nil:
		return fmt.Errorf("deferred: cancel job %s: %w", id.Hex(), err)
	case cur == nil || cur.State == stateSkipped:
		return &NotFoundError{ID: id}
	}
	return &StateError{Op: "cancel", ID: id, State: cur.State}
}

// freeKey clears, best effort, the hints on key's document (due, the head's
// handler) after its head may have been cancelled, and wakes Run.
func (q *Queue) freeKey(ctx context.Context, key bson.RawValue) {
	ctx, cancel := q.settling(ctx)
	defer cancel()
	filter := append(store.IDFilter(key), bson.E{Key: "$or", Value: bson.A{
		bson.D{{Key: "due", Value: bson.D{{Key: "$exists", Value: true}}}},
		bson.D{{Key: keyHandler, Value: bson.D{{Key: "$exists", Value: true}}}},
	}})
	update := bson.D{{Key: "$unset", Value: bson.D{{Key: "due", Value: ""}, {Key: keyHandler, Value: ""}}}}
	_, err := settle.Exec(ctx, q.settleConfig(), settle.Write[struct{}, *keyDoc]{
		Send: q.updated(q.keys, filter, update),
		Read: func(ctx context.Context) (*keyDoc, error) { return q.readKey(ctx, key, true) },
		Judge: func(kd *keyDoc) (settle.Verdict, string) {
			return verdict(kd == nil || kd.Due.IsZero() && kd.H == "", true)
		},
		Resend: true,
	})
	if err != nil {
		q.failed(ctx, "free_key", key, err)
	}
	q.notify()
}

// Wait polls the job with id every interval until it is completed, dead or
// cancelled, or ctx ends, and returns it as last read; a failed read other
// than ErrNotFound or ErrInvalid is tried again. It is for tests, demos and
// tools: a service answers 202 and lets its client poll.
func (q *Queue) Wait(ctx context.Context, id bson.ObjectID, interval time.Duration) (*Job, error) {
	var job *Job
	for {
		cur, err := q.Job(ctx, id)
		switch {
		case err != nil && (errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalid) || ctx.Err() != nil):
			return job, err
		case err == nil && finished(cur.State):
			return cur, nil
		case err == nil:
			job = cur
		}
		q.sleep(ctx, interval)
		if err := ctx.Err(); err != nil {
			return job, fmt.Errorf("deferred: wait for job %s: %w", id.Hex(), err)
		}
	}
}

// Unfinished calls fn with the id and the argument of every job of this
// kind that is not finished (available, running or retryable), in no
// particular order: one query on the jobs collection, the argument only.
// A job whose stored argument does not decode into A is skipped (it dies
// with an *InvalidError when it runs). It stops at fn's first error and
// returns it. A job enqueued or finished while it reads may or may not be
// seen.
func (k *Kind[A]) Unfinished(ctx context.Context, fn func(id bson.ObjectID, args A) error) error {
	if err := checkCtx(ctx, "unfinished"); err != nil {
		return err
	}
	if fn == nil {
		return invalid("unfinished", "fn", "nil", nil)
	}
	cur, err := k.q.jobs.Find(ctx, bson.D{
		{Key: "name", Value: k.h.name},
		{Key: "state", Value: bson.D{{Key: "$in", Value: bson.A{StateAvailable, StateRunning, StateRetryable}}}},
	}, options.Find().SetProjection(bson.D{{Key: "args", Value: 1}}))
	if err != nil {
		return fmt.Errorf("deferred: unfinished %s: %w", k.h.name, err)
	}
	defer func() { _ = cur.Close(context.WithoutCancel(ctx)) }()
	for cur.Next(ctx) {
		var job struct {
			ID   bson.ObjectID `bson:"_id"`
			Args bson.RawValue `bson:"args"`
		}
		if err := cur.Decode(&job); err != nil {
			return fmt.Errorf("deferred: unfinished %s: %w", k.h.name, err)
		}
		var a A
		if job.Args.Unmarshal(&a) != nil {
			continue
		}
		if err := fn(job.ID, a); err != nil {
			return err
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("deferred: unfinished %s: %w", k.h.name, err)
	}
	return nil
}

package deferred

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/store"
)

// Enqueue: reserve a number on the key, then insert the job at its place
// (DESIGN.md, Enqueue).

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
		Send: q.updated(q.jobs, filter, update),
		Read: func(ctx context.Context) (*Job, error) { return q.majorityJob(ctx, bson.D{{Key: "_id", Value: id}}) },
		Judge: func(job *Job) (settle.Verdict, string) {
			return verdict(job == nil || job.Seq != seq, job != nil && job.State == StateAvailable)
		},
		Resend: true,
	})
	return res.Applied, err
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

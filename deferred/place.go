package deferred

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/store"
)

// A key's order: its document (the head, the count of waiting numbers,
// the hints), the places of its jobs, holes and tombstones, and moving the
// head on (DESIGN.md, Collections, Places, Holes).

// keyHandler is the field of a key's document naming its head's handler,
// set by a process that lacks it (see noHead).
const keyHandler = "h"

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

// holder reads at majority the id of what holds seq on key raw, a job or a
// tombstone (zero: nothing).
func (q *Queue) holder(ctx context.Context, raw bson.RawValue, seq int64) (id bson.ObjectID, err error) {
	job, err := q.majorityJob(ctx, at(raw, seq))
	if job != nil {
		id = job.ID
	}
	return id, err
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
	landed, serr := q.decideByTombstone(ctx, raw, seq, id)
	switch {
	case serr != nil:
		return false, &UnknownOutcomeError{Pkg: "deferred", Op: op, ID: id, Subject: "job " + id.Hex(), Err: errors.Join(err, serr)}
	case landed || ue == nil:
		return landed, nil
	}
	return false, ue.Err
}

// decideByTombstone decides whether the write that puts the job id at seq landed when
// the engine could not tell, by inserting the number's tombstone: landed,
// the write cannot land any more; refused, what holds the number tells. An
// error leaves the outcome unknown. It runs on the settling context.
func (q *Queue) decideByTombstone(ctx context.Context, raw bson.RawValue, seq int64, id bson.ObjectID) (landed bool, err error) {
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

// readKey reads a key's document (nil: none), at majority when atMajority.
func (q *Queue) readKey(ctx context.Context, raw bson.RawValue, atMajority bool) (*keyDoc, error) {
	kd := new(keyDoc)
	read := func(c *mongo.Collection) error { return c.FindOne(ctx, store.IDFilter(raw)).Decode(kd) }
	if _, keys := q.majority(); atMajority {
		return found(kd, keys.Read(ctx, read))
	}
	return found(kd, read(q.keys))
}

// ahead reads the key's places from head on, up to limit, and returns the
// run runOf may claim among them, and how many places it spans.
func (h *hold) ahead(ctx context.Context, head int64, limit int, now time.Time) ([]*Job, int64, error) {
	q := h.q
	var docs []*Job
	err := q.try(ctx, func(ctx context.Context) error {
		filter := bson.D{{Key: "p", Value: bson.D{{Key: "$gte", Value: placeOf(h.key, head)}, {Key: "$lt", Value: placeOf(h.key, head+int64(limit))}}}}
		cur, err := q.jobs.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "p", Value: 1}}))
		if err != nil {
			return err
		}
		docs = nil
		return cur.All(ctx, &docs)
	})
	var jobs []*Job
	var span int64
	for _, job := range docs {
		alone := job.State == StateRunning || job.Attempt >= job.MaxAttempts
		switch {
		case job.Seq != head+span:
		case len(jobs) > 0 && finished(job.State):
			span++
			continue
		case finished(job.State) || job.Epoch > h.l.Epoch() || job.RunAt.After(now) || q.handler(job.Name) == nil:
		case job.State == StateRunning && job.Epoch == h.l.Epoch() && job.Owner == q.c.Owner:
		case len(jobs) > 0 && (alone || q.handler(jobs[0].Name).batch != nil && job.Name != jobs[0].Name):
		default:
			jobs = append(jobs, job)
			span++
			if !alone {
				continue
			}
		}
		break
	}
	if len(jobs) > 0 {
		span = max(span, jobs[len(jobs)-1].Seq-head+1)
	}
	return jobs, span, err
}

// head reads the job at seq on the claim's key: nil when there is none.
func (h *hold) head(ctx context.Context, seq int64) (*Job, error) {
	job := new(Job)
	return found(job, h.q.try(ctx, func(ctx context.Context) error { return h.q.jobs.FindOne(ctx, at(h.key, seq)).Decode(job) }))
}

// noHead handles a head seq with no job to claim: finished already (its
// worker died before moving the head), claimed under a newer lease, of a
// handler this process lacks, not due, or not there (a hole: DESIGN.md).
func (h *hold) noHead(kd keyDoc, seq int64) (keyDoc, bool) {
	q := h.q
	ctx, cancel := h.book()
	defer cancel()
	job, err := h.head(ctx, seq)
	now := q.now(ctx)
	switch {
	case err != nil:
		h.warn("read_head", err)
		return kd, false
	case job == nil:
	case finished(job.State):
		return h.advance(kd, 1)
	case job.Epoch > h.l.Epoch():
		// Claimed by a newer holder of the key: this claim is lost.
		return kd, false
	case q.handler(job.Name) == nil:
		// A handler this process lacks: name it on the key (the search of
		// such processes skips it) and skip it here a poll interval anyway.
		h.skip = true
		h.skipped(job)
		h.setKey(bson.D{{Key: keyHandler, Value: job.Name}})
		return kd, false
	default:
		// Not due yet: give the key up until then.
		h.setKey(bson.D{{Key: "due", Value: job.RunAt}})
		return h.recheck(kd, seq)
	}
	// No job yet: most often its enqueuer is between its two writes.
	since := now
	if kd.Hole != nil && kd.Hole.Seq == seq {
		since = kd.Hole.Since
	} else {
		h.setKey(bson.D{{Key: "hole", Value: hole{Seq: seq, Since: now}}})
	}
	if now.Sub(since) < q.c.HoleTimeout {
		for d := 5 * time.Millisecond; d <= 80*time.Millisecond; d *= 2 {
			q.sleep(h.jobs, d)
			if h.lost() || h.run.Err() != nil {
				return kd, false
			}
			if q.landed(ctx, h.key, seq) {
				return kd, true // it landed: look again
			}
		}
		wait := min(max(now.Sub(since), q.c.PollInterval/10), since.Add(q.c.HoleTimeout).Sub(now))
		h.setKey(bson.D{{Key: "due", Value: now.Add(wait)}})
		return kd, false
	}
	// Missing for HoleTimeout: skip it (a late insert then fails on the index).
	if err := q.tombstone(ctx, h.key, seq); err != nil && !store.IsDuplicateKey(err) {
		h.warn("skip_hole", err)
		return kd, false
	}
	return kd, true
}

// landed says whether the job at seq of key raw is in the collection: a
// find of its _id by the unique place (a count is an aggregation, which
// costs DocumentDB tens of milliseconds).
func (q *Queue) landed(ctx context.Context, raw bson.RawValue, seq int64) bool {
	err := q.jobs.FindOne(ctx, at(raw, seq), options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
	return err == nil
}

// recheck reads the head at seq after this claim set the key's due, and
// moves the head on if it is finished: a Cancel whose clearing of due came
// before this claim's due is seen by this read (DESIGN.md, Running a key).
func (h *hold) recheck(kd keyDoc, seq int64) (keyDoc, bool) {
	ctx, cancel := h.book()
	job, err := h.head(ctx, seq)
	cancel()
	if err == nil && job != nil && finished(job.State) && !h.lost() {
		return h.advance(kd, 1)
	}
	return kd, false
}

// advance moves the key's head past its next m places, fenced on this
// claim and on the head's position: a resent copy, or a worker that lost
// the key, moves nothing.
func (h *hold) advance(kd keyDoc, m int64) (keyDoc, bool) {
	q := h.q
	ctx, cancel := h.book()
	defer cancel()
	now := q.now(ctx)
	filter := append(append(store.IDFilter(h.key), bson.E{Key: "done", Value: kd.Done}), h.l.Fence()...)
	update := bson.D{
		{Key: "$inc", Value: bson.D{{Key: "done", Value: m}, {Key: "n", Value: -m}}},
		{Key: "$set", Value: bson.D{{Key: "t", Value: now}}},
		{Key: "$unset", Value: bson.D{{Key: "due", Value: ""}, {Key: "hole", Value: ""}, {Key: keyHandler, Value: ""}}},
	}
	res, err := settle.Exec(ctx, q.settleConfig(), settle.Write[*keyDoc, *keyDoc]{
		// Matching nothing, the fence failed: the claim is lost.
		Send: modified[keyDoc](q, q.keys, filter, update, options.After),
		Read: func(ctx context.Context) (*keyDoc, error) { return q.readKey(ctx, h.key, true) },
		Judge: func(cur *keyDoc) (settle.Verdict, string) {
			return verdict(cur != nil && cur.Done >= kd.Done+m, cur != nil)
		},
		Resend: true,
	})
	switch {
	case err != nil:
		h.warn("move_head", err)
		return kd, false
	case res.Applied:
		return *shown(res), !h.lost()
	}
	return kd, false
}

// setKey sets fields of the key's document under this claim's fence.
func (h *hold) setKey(set bson.D) {
	ctx, cancel := h.book()
	defer cancel()
	filter := append(store.IDFilter(h.key), h.l.Fence()...)
	t := h.q.now(ctx).Truncate(time.Millisecond) // as stored
	set = append(set, bson.E{Key: "t", Value: t})
	// $set is idempotent; the time it sets tells whether it landed.
	_, err := settle.Exec(ctx, h.q.settleConfig(), settle.Write[struct{}, *keyDoc]{
		Send:   h.q.updated(h.q.keys, filter, bson.D{{Key: "$set", Value: set}}),
		Read:   func(ctx context.Context) (*keyDoc, error) { return h.q.readKey(ctx, h.key, true) },
		Judge:  func(kd *keyDoc) (settle.Verdict, string) { return verdict(kd != nil && kd.T.Equal(t), kd != nil) },
		Resend: true,
	})
	if err != nil {
		h.warn("update_key", err)
	}
}

package deferred

import (
	"context"
	"errors"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/store"
)

// A claim of jobs has an identity of its own (DESIGN.md, Claims of jobs):
// every claim write sets a new id in the jobs' field c and is conditioned on
// the id each job carried when its worker read it; every write that acts on
// a claimed job (record, snooze, fail, put back) is conditioned on the job
// running under its claim's id. Ids are never reused, and c changes only to
// a new one, so a copy of a write that arrives once the job has moved on
// matches nothing.

// claimField is the field of a job that holds the id of its last claim.
const claimField = "c"

// claimSent is a worker's claim of one job: the id it sent, and the id and
// state the job had when read, which the claim is conditioned on (prior
// zero: the job was never claimed). Once the claim is sent its outcome may
// be unknown: putBack then voids it.
type claimSent struct {
	id, prior bson.ObjectID
	state     State
}

// claimCond is a condition on a job's claim id (zero: none) and, unless
// empty, its state.
type claimCond struct {
	id    bson.ObjectID
	state State
}

// claimWrite is one claim of jobs of a key, taken in one write: its id, the
// jobs, the key lease's epoch it was sent under, and its filter and update.
type claimWrite struct {
	id     bson.ObjectID
	jobs   []*Job
	epoch  int64
	now    time.Time
	filter bson.D
	update bson.D
}

// newClaim returns the claim of jobs, read by ahead, under this hold's lease
// at now: conditioned on each job's claim id and state as read (waiting,
// or running under a lost worker's claim: taken over), and on no newer
// holder of the key having claimed it (epoch). It sets started to the
// server's time as it applies ($currentDate), which tells a later holder
// whether the claim landed before or after that holder took the key. It
// counts an attempt, but for a job whose claim landed after this hold took
// the key (never started: see neverStarted), which runs alone. It records
// the claim on the jobs (Job.cl).
func (h *hold) newClaim(jobs []*Job, now time.Time) *claimWrite {
	cw := &claimWrite{id: bson.NewObjectID(), jobs: jobs, epoch: h.l.Epoch(), now: now}
	for _, job := range jobs {
		job.cl = claimSent{id: cw.id, prior: job.Claim, state: job.State}
	}
	owner := h.q.c.Owner
	cw.filter = append(idsFilter(jobs),
		bson.E{Key: "epoch", Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: cw.epoch}}}}},
	)
	cw.filter = append(cw.filter, byClaim(jobs, func(j *Job) claimCond { return claimCond{j.cl.prior, j.cl.state} })...)
	cw.update = bson.D{
		{Key: "$set", Value: bson.D{
			{Key: "state", Value: StateRunning}, {Key: "owner", Value: owner}, {Key: "epoch", Value: cw.epoch},
			{Key: claimField, Value: cw.id},
		}},
		{Key: "$currentDate", Value: bson.D{{Key: "started", Value: true}}},
	}
	if len(jobs) != 1 || !h.neverStarted(jobs[0]) {
		cw.update = append(cw.update, bson.E{Key: "$inc", Value: bson.D{{Key: "attempt", Value: 1}}})
	}
	return cw
}

// neverStarted reports whether job, as read, runs under a claim that landed
// after this hold took the key (its started, set by the server as the claim
// applied, is after the lease's acquiredAt, on the same clock): a copy of
// an earlier holder's claim that arrived late. That holder's lease had
// ended by then, and with it the context its handler would have run under,
// so the job never started: it is taken over without counting an attempt
// or marking it as possibly applied (DESIGN.md, Claims of jobs, gap A).
func (h *hold) neverStarted(job *Job) bool {
	return job.State == StateRunning && job.StartedAt.After(h.l.AcquiredAt())
}

// ids returns the ids of the claim's jobs.
func (cw *claimWrite) ids() bson.A {
	ids := make(bson.A, len(cw.jobs))
	for i, job := range cw.jobs {
		ids[i] = job.ID
	}
	return ids
}

// landedOn reports whether j, as read, runs under this claim.
func (cw *claimWrite) landedOn(j *Job) bool {
	return j.State == StateRunning && j.Claim == cw.id
}

// couldLandOn reports whether a copy of the claim could still apply to j,
// as read: it carries the claim id and the state the claim was conditioned
// on, claimed by no newer holder of the key.
func (cw *claimWrite) couldLandOn(j *Job) bool {
	for _, job := range cw.jobs {
		if job.ID == j.ID {
			return j.Claim == job.cl.prior && j.State == job.cl.state && j.Epoch <= cw.epoch
		}
	}
	return false
}

// idsFilter is the filter of jobs by _id: one id, or $in.
func idsFilter(jobs []*Job) bson.D {
	if len(jobs) == 1 {
		return bson.D{{Key: "_id", Value: jobs[0].ID}}
	}
	ids := make(bson.A, len(jobs))
	for i, job := range jobs {
		ids[i] = job.ID
	}
	return bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}
}

// byClaim is the condition that each of jobs matches the claimCond of(job)
// gives, to add to a filter of their ids: one set of conditions when they
// share it, else one per group of ids.
func byClaim(jobs []*Job, of func(*Job) claimCond) bson.D {
	var order []claimCond
	groups := map[claimCond]bson.A{}
	for _, job := range jobs {
		k := of(job)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], job.ID)
	}
	carries := func(k claimCond) bson.D {
		d := bson.D{{Key: claimField, Value: k.id}}
		if k.id.IsZero() {
			d = bson.D{{Key: claimField, Value: bson.D{{Key: "$exists", Value: false}}}}
		}
		if k.state != "" {
			d = append(d, bson.E{Key: "state", Value: k.state})
		}
		return d
	}
	if len(order) == 1 {
		return carries(order[0])
	}
	or := make(bson.A, 0, len(order))
	for _, k := range order {
		or = append(or, append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: groups[k]}}}}, carries(k)...))
	}
	return bson.D{{Key: "$or", Value: or}}
}

// underClaim is the filter of jobs running under this worker's claim of
// each: the filter of every write that acts on a claimed job.
func underClaim(jobs []*Job) bson.D {
	f := append(idsFilter(jobs), bson.E{Key: "state", Value: StateRunning})
	return append(f, byClaim(jobs, func(j *Job) claimCond { return claimCond{id: j.cl.id} })...)
}

// take sends cw, the claim of jobs read by ahead, and settles it; applied
// false means one of them changed meanwhile (nothing of this claim then
// holds but what putBack gives back); an error, that its outcome is
// unknown (putBack voids it). prior, if not nil, is the ambiguous error of
// a copy of cw sent already (see recordTaking).
func (h *hold) take(cw *claimWrite, prior error) (bool, error) {
	q := h.q
	ctx, cancel := h.book()
	defer cancel()
	ids := cw.ids()
	res, err := settle.Exec(ctx, q.settleConfig(), settle.Write[struct{}, []Job]{
		Send: sentOnce(prior, q.updated(q.jobs, cw.filter, cw.update, int64(len(cw.jobs)))),
		Read: func(ctx context.Context) ([]Job, error) { return q.majorityJobs(ctx, ids) },
		Judge: func(cur []Job) (settle.Verdict, string) {
			landed, live := len(cur) == len(cw.jobs), true
			for _, j := range cur {
				isMine := cw.landedOn(&j)
				landed = landed && isMine
				live = live && (isMine || cw.couldLandOn(&j))
			}
			return verdict(landed, live)
		},
		Resend: true,
	})
	if err != nil || !res.Applied {
		return false, err
	}
	h.took(cw)
	return true, nil
}

// took updates the jobs of cw, read by ahead, as claimed by it.
func (h *hold) took(cw *claimWrite) {
	for _, job := range cw.jobs {
		// Taken over from a lost worker, whose handler may have written,
		// unless its claim landed after this hold took the key.
		fresh := len(cw.jobs) == 1 && h.neverStarted(job)
		job.q, job.att = h.q, &attempt{may: job.State == StateRunning && !fresh}
		job.State, job.Owner, job.Epoch, job.StartedAt, job.Claim = StateRunning, h.q.c.Owner, cw.epoch, cw.now, cw.id
		if !fresh {
			job.Attempt++
		}
		h.claimed(job)
	}
}

// recordTaking records done, which this claim ran, as completed and claims
// next, the job after it in the run, in one command of two statements
// (record, then claim): a handler's run costs two round trips a job, the
// handler's write and this. It reports whether done was recorded and what
// became of the claim of next (nextUnsure: the caller puts it back, which
// its filter on this claim makes harmless if it did not apply). Where the
// reply does not say both applied, each is finished on its own: after a
// reply lost, through settle as a write sent once already; otherwise from a
// read of the two, sending again what did not apply.
func (h *hold) recordTaking(done, next *Job) (bool, nextClaim) {
	q := h.q
	ctx, cancel := h.book()
	defer cancel()
	now := q.now(ctx)
	cw := h.newClaim([]*Job{next}, now)
	var matched int64
	err := q.try(ctx, func(ctx context.Context) error {
		res, err := q.jobs.BulkWrite(ctx, []mongo.WriteModel{
			mongo.NewUpdateOneModel().SetFilter(underClaim([]*Job{done})).SetUpdate(h.completed(done.att.wrote(), now)),
			mongo.NewUpdateOneModel().SetFilter(cw.filter).SetUpdate(cw.update),
		})
		if err == nil {
			matched = res.MatchedCount
		}
		return err
	})
	if err == nil && matched == 2 {
		h.wasRecorded([]*Job{done})
		h.took(cw)
		return true, nextTaken
	}
	var prior error // the record and the claim are each a write sent once: their reply was lost
	recorded, taken := false, false
	if store.IsAmbiguous(err) {
		prior = err
	} else {
		// The reply says what applied, not which: read the two.
		cur, rerr := settle.Reread(ctx, q.settleConfig(), func(ctx context.Context) ([]Job, error) {
			return q.majorityJobs(ctx, bson.A{done.ID, next.ID})
		})
		if rerr != nil {
			h.warn("record_attempt", rerr)
			return false, nextUnsure
		}
		for _, j := range cur {
			switch {
			case j.ID == done.ID && j.State == StateCompleted && j.Claim == done.cl.id:
				recorded = true
			case j.ID == next.ID && cw.landedOn(&j):
				taken = true
			}
		}
	}
	switch {
	case recorded:
		h.wasRecorded([]*Job{done})
	case !h.record([]*Job{done}, prior):
		// Unrecorded: done stays running for the key's next holder; next,
		// which never starts here, goes back if the claim may have applied.
		if taken || prior != nil {
			return false, nextUnsure
		}
		return false, nextNotTaken
	}
	if taken {
		h.took(cw)
		return true, nextTaken
	}
	ok, err := h.take(cw, prior)
	switch {
	case ok:
		return true, nextTaken
	case err != nil:
		h.warn("claim_job", err)
		return true, nextUnsure
	}
	return true, nextNotTaken
}

// nextClaim is what became of the claim of the next job that a record
// carried (recordTaking).
type nextClaim int

const (
	nextNotTaken nextClaim = iota // it did not apply
	nextTaken                     // it applied: the job runs next under this claim
	nextUnsure                    // it may have applied: put the job back
)

// errUnrecorded says a job completed and its record failed.
var errUnrecorded = errors.New("deferred: record a completed job")

// record records jobs as completed, in one write, unless they are already.
// prior, if not nil, is the ambiguous error of a copy of the write sent
// already (see recordTaking).
func (h *hold) record(jobs []*Job, prior error) bool {
	jobs = slices.DeleteFunc(slices.Clone(jobs), func(j *Job) bool { return j.State == StateCompleted })
	if len(jobs) == 0 {
		return true
	}
	q := h.q
	ctx, cancel := h.book()
	defer cancel()
	now := q.now(ctx)
	ok, err := h.updateJobs(ctx, jobs, StateCompleted, func(mw bool) bson.D { return h.completed(mw, now) }, prior)
	if err != nil || !ok {
		h.warn("record_attempt", err)
		return false
	}
	h.wasRecorded(jobs)
	return true
}

// completed is the update that records jobs completed at now (mw: their
// attempts may have written).
func (h *hold) completed(mw bool, now time.Time) bson.D {
	return bson.D{{Key: "$set", Value: jobSet(mw, bson.E{Key: "state", Value: StateCompleted}, bson.E{Key: "finished", Value: now},
		bson.E{Key: "expireAt", Value: now.Add(h.q.c.Retention)})}}
}

// wasRecorded marks jobs as recorded completed.
func (h *hold) wasRecorded(jobs []*Job) {
	for _, job := range jobs {
		job.State = StateCompleted
		h.recorded(job, outcome{}, StateCompleted, 0)
	}
}

// outcome is what an attempt came to.
type outcome struct {
	err     error         // nil: completed (or snoozed)
	dead    bool          // failed for good
	snoozed bool          // snoozed, for snooze
	snooze  time.Duration //
}

// finish records the outcome of job's attempt and, when the job no longer
// holds the key (completed, dead), moves the key's head on.
func (h *hold) finish(kd keyDoc, job *Job, o outcome) (keyDoc, bool) {
	q := h.q
	ctx, cancel := h.book()
	now := q.now(ctx)
	var set bson.D
	var push bson.D
	inc := bson.D{}
	var runAt time.Time
	var to State
	switch {
	case o.snoozed:
		to, runAt = StateAvailable, now.Add(o.snooze)
		set = bson.D{{Key: "runAt", Value: runAt}}
		inc = bson.D{{Key: "attempt", Value: -1}, {Key: "snoozes", Value: 1}}
	case o.err == nil:
		to = StateCompleted
		set = bson.D{{Key: "finished", Value: now}, {Key: "expireAt", Value: now.Add(q.c.Retention)}}
	case o.dead:
		to = StateDead
		set = bson.D{{Key: "finished", Value: now}}
	default:
		to, runAt = StateRetryable, now.Add(q.delay(job.Attempt))
		set = bson.D{{Key: "runAt", Value: runAt}}
	}
	set = jobSet(job.att.wrote(), append(bson.D{{Key: "state", Value: to}}, set...)...)
	if o.err != nil {
		e := attemptError(job.Attempt, now, o.err)
		if n := len(job.Errors); n >= MaxErrors {
			// Keep the newest: the list read with the claim is the one stored.
			set = append(set, bson.E{Key: "errors", Value: append(job.Errors[n-MaxErrors+1:n:n], e)})
		} else {
			push = bson.D{{Key: "errors", Value: e}}
		}
	}
	update := bson.D{{Key: "$set", Value: set}}
	if len(push) > 0 {
		update = append(update, bson.E{Key: "$push", Value: push})
	}
	if len(inc) > 0 {
		update = append(update, bson.E{Key: "$inc", Value: inc})
	}
	ok, err := h.updateJobs(ctx, []*Job{job}, to, func(bool) bson.D { return update }, nil)
	cancel()
	if err != nil || !ok {
		if err != nil {
			h.warn("record_attempt", err)
		}
		return kd, false
	}
	h.recorded(job, o, to, runAt.Sub(now))
	if !runAt.IsZero() {
		h.setKey(bson.D{{Key: "due", Value: runAt}})
		return kd, false
	}
	return h.advance(kd, 1)
}

// jobSet is the $set of a job's record: set, and mw when its attempt may
// have written (sticky: never unset).
func jobSet(mw bool, set ...bson.E) bson.D {
	if mw {
		set = append(set, bson.E{Key: "mw", Value: true})
	}
	return set
}

// attemptError is the record of a failed attempt.
func attemptError(n int, at time.Time, err error) AttemptError {
	msg := err.Error()
	var p *PanicError
	isPanic := errors.As(err, &p)
	if isPanic {
		msg += "\n" + p.Stack
	}
	if len(msg) > 2048 {
		msg = msg[:2048] + "…"
	}
	return AttemptError{Attempt: n, At: at, Error: msg, Panic: isPanic}
}

// updateJobs applies update(mw) to jobs running under this worker's claim
// of each (mw: whether its attempt may have written), an updateMany per
// value of mw, and reports whether it did to all (false: one was taken
// over). A lost reply: state to under the claim, landed; still running
// under it, live.
func (h *hold) updateJobs(ctx context.Context, jobs []*Job, to State, update func(mw bool) bson.D, prior error) (bool, error) {
	q := h.q
	var groups [2][]*Job
	ids := make(bson.A, 0, len(jobs))
	sent := map[bson.ObjectID]bson.ObjectID{}
	for _, job := range jobs {
		mw := 0
		if job.att.wrote() {
			mw = 1
		}
		groups[mw] = append(groups[mw], job)
		ids = append(ids, job.ID)
		sent[job.ID] = job.cl.id
	}
	res, err := settle.Exec(ctx, q.settleConfig(), settle.Write[struct{}, []Job]{
		Send: sentOnce(prior, func(ctx context.Context) (struct{}, bool, error) {
			for mw, group := range groups {
				if len(group) == 0 {
					continue
				}
				if _, ok, err := q.updated(q.jobs, underClaim(group), update(mw == 1), int64(len(group)))(ctx); !ok || err != nil {
					return struct{}{}, false, err
				}
			}
			return struct{}{}, true, nil
		}),
		Read: func(ctx context.Context) ([]Job, error) { return q.majorityJobs(ctx, ids) },
		Judge: func(cur []Job) (settle.Verdict, string) {
			landed, live := len(cur) == len(jobs), true
			for _, j := range cur {
				mine := j.Claim == sent[j.ID]
				landed = landed && mine && j.State == to
				live = live && mine && (j.State == to || j.State == StateRunning)
			}
			return verdict(landed, live)
		},
		Resend: true,
	})
	return res.Applied, err
}

// putBack returns claimed jobs to the available state without counting
// their attempts, and voids this worker's claim of each where it did not
// land: one command of two statements, in order, each conditioned on a
// claim's identity. The first sets a new claim id on a job that still
// carries the one its claim replaced (the claim did not land, and now no
// copy of it can); the second puts back a job running under its claim. A
// lost reply: a job that carries neither, landed; else live (sent again:
// each statement applies at most once). Unsettled, it leaves a claim that
// may still land: the key is then not released (h.unsure; its lease
// expires instead).
func (h *hold) putBack(jobs ...*Job) {
	if len(jobs) == 0 {
		return
	}
	q := h.q
	ctx, cancel := h.book()
	defer cancel()
	void := bson.NewObjectID()
	var ids [2]bson.A
	var byMW [2][]*Job
	for _, job := range jobs {
		mw := 0
		if job.att.wrote() {
			mw = 1
		}
		ids[mw] = append(ids[mw], job.ID)
		byMW[mw] = append(byMW[mw], job)
	}
	models := []mongo.WriteModel{
		mongo.NewUpdateManyModel().
			SetFilter(append(idsFilter(jobs), byClaim(jobs, func(j *Job) claimCond { return claimCond{id: j.cl.prior} })...)).
			SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: claimField, Value: void}}}}),
	}
	for mw, group := range byMW {
		if len(group) > 0 {
			models = append(models, mongo.NewUpdateManyModel().SetFilter(underClaim(group)).SetUpdate(bson.D{
				{Key: "$set", Value: jobSet(mw == 1, bson.E{Key: "state", Value: StateAvailable})},
				{Key: "$inc", Value: bson.D{{Key: "attempt", Value: -1}}},
			}))
		}
	}
	sent := map[bson.ObjectID]claimSent{}
	for _, job := range jobs {
		sent[job.ID] = job.cl
	}
	_, err := settle.Exec(ctx, q.settleConfig(), settle.Write[struct{}, []Job]{
		Send: func(ctx context.Context) (struct{}, bool, error) {
			return struct{}{}, true, q.try(ctx, func(ctx context.Context) error {
				_, err := q.jobs.BulkWrite(ctx, models)
				return err
			})
		},
		Read: func(ctx context.Context) ([]Job, error) { return q.majorityJobs(ctx, append(ids[0], ids[1]...)) },
		Judge: func(cur []Job) (settle.Verdict, string) {
			for _, j := range cur {
				cl := sent[j.ID]
				if j.Claim == cl.prior || j.Claim == cl.id && j.State == StateRunning {
					return verdict(false, true)
				}
			}
			return verdict(true, true)
		},
		Resend: true,
	})
	if err != nil {
		h.warn("put_back", err)
		h.unsure = true
	}
}

// sentOnce returns send, but for its first call when prior is not nil: that
// one returns prior, the ambiguous error of a copy of the write sent
// already, so that settle.Exec settles it (reads, and sends again only
// while the write is live).
func sentOnce[R any](prior error, send func(context.Context) (R, bool, error)) func(context.Context) (R, bool, error) {
	if prior == nil {
		return send
	}
	return func(ctx context.Context) (R, bool, error) {
		if err := prior; err != nil {
			prior = nil
			var zero R
			return zero, false, err
		}
		return send(ctx)
	}
}

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
// jobs, the key lease's epoch it was sent under, and its update (the same
// for each job; filter gives each job's own filter).
type claimWrite struct {
	id     bson.ObjectID
	jobs   []*Job
	epoch  int64
	now    time.Time
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

// filter is the claim's filter of job: its claim id and state as read, and
// no newer holder of the key.
func (cw *claimWrite) filter(job *Job) bson.D {
	return append(jobFilter(job, claimCond{job.cl.prior, job.cl.state}),
		bson.E{Key: "epoch", Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: cw.epoch}}}}})
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

// jobFilter is the filter of job by its _id and the claim condition k: it
// carries the claim id k.id (zero: none) and, unless k.state is empty, is
// in state k.state.
func jobFilter(job *Job, k claimCond) bson.D {
	f := bson.D{{Key: "_id", Value: job.ID}, {Key: claimField, Value: k.id}}
	if k.id.IsZero() {
		f[1].Value = bson.D{{Key: "$exists", Value: false}}
	}
	if k.state != "" {
		f = append(f, bson.E{Key: "state", Value: k.state})
	}
	return f
}

// underClaim is the filter of job running under this worker's claim of it:
// the filter of every write that acts on a claimed job.
func underClaim(job *Job) bson.D {
	return jobFilter(job, claimCond{id: job.cl.id, state: StateRunning})
}

// eachJob is the update of several jobs, update(job) to each job that
// filter(job) matches (filter names the job by its _id), as the statements
// of one command: one per job. Not one updateMany by {_id: {$in: ids}}:
// DocumentDB plans that through another index the filter names
// (deferred_state: every job in the state a claim or a record expects,
// thousands under a backlog), where a statement per job finds its job by
// _id. Each statement applies to one job, atomically, as each document of
// an updateMany does: the protocol never counted on more. On a server that
// finds a document by _id only when the filter holds nothing else
// (FerretDB v1, which decodes the whole collection for any other filter:
// Queue.oneScan), it is instead an updateMany per distinct update, whose
// filter is the jobs' ids ($in, which that server tests first) and the $or
// of their filters: one scan, not one per job; each job still matches its
// own filter only.
func (q *Queue) eachJob(jobs []*Job, filter, update func(*Job) bson.D) []mongo.WriteModel {
	if !q.oneScan.Load() {
		models := make([]mongo.WriteModel, len(jobs))
		for i, job := range jobs {
			models[i] = mongo.NewUpdateOneModel().SetFilter(filter(job)).SetUpdate(update(job))
		}
		return models
	}
	var order []string
	updates := map[string]bson.D{}
	filters, ids := map[string][]bson.D{}, map[string]bson.A{}
	for _, job := range jobs {
		u := update(job)
		raw, err := bson.Marshal(u)
		if err != nil {
			raw = nil // not a document: the server will say so
		}
		k := string(raw)
		if _, ok := updates[k]; !ok {
			order = append(order, k)
			updates[k] = u
		}
		filters[k] = append(filters[k], filter(job))
		ids[k] = append(ids[k], job.ID)
	}
	models := make([]mongo.WriteModel, 0, len(order))
	for _, k := range order {
		f := bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids[k]}}}, {Key: "$or", Value: filters[k]}}
		if len(filters[k]) == 1 {
			f = filters[k][0]
		}
		models = append(models, mongo.NewUpdateManyModel().SetFilter(f).SetUpdate(updates[k]))
	}
	return models
}

// same returns update, for eachJob: one update for every job.
func same(update bson.D) func(*Job) bson.D { return func(*Job) bson.D { return update } }

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
		Send: sentOnce(prior, q.updatedEach(q.eachJob(cw.jobs, cw.filter, same(cw.update)), len(cw.jobs))),
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
			mongo.NewUpdateOneModel().SetFilter(underClaim(done)).SetUpdate(h.completed(done.att.wrote(), now)),
			mongo.NewUpdateOneModel().SetFilter(cw.filter(next)).SetUpdate(cw.update),
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
// of each (mw: whether its attempt may have written), in one command of a
// statement per job, and reports whether it did to all (false: one was
// taken over). A lost reply: state to under the claim, landed; still
// running under it, live.
func (h *hold) updateJobs(ctx context.Context, jobs []*Job, to State, update func(mw bool) bson.D, prior error) (bool, error) {
	q := h.q
	models := q.eachJob(jobs, underClaim, func(j *Job) bson.D { return update(j.att.wrote()) })
	ids := make(bson.A, len(jobs))
	sent := map[bson.ObjectID]bson.ObjectID{}
	for i, job := range jobs {
		ids[i] = job.ID
		sent[job.ID] = job.cl.id
	}
	res, err := settle.Exec(ctx, q.settleConfig(), settle.Write[struct{}, []Job]{
		Send: sentOnce(prior, q.updatedEach(models, len(jobs))),
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
// land: one command, in order, of the voids, then the put-backs (eachJob),
// each conditioned on a claim's identity. A void sets a new claim id on a
// job that still carries the one its claim replaced (the claim did not
// land, and now no copy of it can); a put-back puts back a job running
// under its claim. A
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
	ids := make(bson.A, len(jobs))
	for i, job := range jobs {
		ids[i] = job.ID
	}
	models := q.eachJob(jobs, func(j *Job) bson.D { return jobFilter(j, claimCond{id: j.cl.prior}) },
		same(bson.D{{Key: "$set", Value: bson.D{{Key: claimField, Value: void}}}}))
	models = append(models, q.eachJob(jobs, underClaim, func(j *Job) bson.D {
		return bson.D{
			{Key: "$set", Value: jobSet(j.att.wrote(), bson.E{Key: "state", Value: StateAvailable})},
			{Key: "$inc", Value: bson.D{{Key: "attempt", Value: -1}}},
		}
	})...)
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
		Read: func(ctx context.Context) ([]Job, error) { return q.majorityJobs(ctx, ids) },
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

package deferred

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/settle"
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

// claimSent is a worker's claim of one job: the id it sent, and the id the
// job carried before it (zero: none, the job was never claimed). Once the
// claim is sent its outcome may be unknown: putBack then voids it.
type claimSent struct {
	id, prior bson.ObjectID
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

// claimable is the states a claim takes a job from: waiting, or running
// under an earlier claim whose worker was lost (taken over).
var claimable = bson.A{StateAvailable, StateRetryable, StateRunning}

// newClaim returns the claim of jobs, read by ahead, under this hold's lease
// at now: conditioned on each job's claim id as read, on a state it can be
// claimed from, on no newer holder of the key having claimed it (epoch),
// and, where the lease's expiry is judged by the server, on the lease not
// having expired (so that a copy that arrives after another worker took the
// key matches nothing). It records the claim on the jobs (Job.cl).
func (c *claim) newClaim(jobs []*Job, now time.Time) *claimWrite {
	cw := &claimWrite{id: bson.NewObjectID(), jobs: jobs, epoch: c.l.Epoch(), now: now}
	for _, job := range jobs {
		job.cl = claimSent{id: cw.id, prior: job.Claim}
	}
	owner := c.q.c.Owner
	cw.filter = append(idsFilter(jobs),
		bson.E{Key: "state", Value: bson.D{{Key: "$in", Value: claimable}}},
		bson.E{Key: "epoch", Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: cw.epoch}}}}},
	)
	cw.filter = append(cw.filter, byClaim(jobs, func(j *Job) bson.ObjectID { return j.cl.prior })...)
	cw.filter = append(cw.filter, c.leaseTime()...)
	cw.update = bson.D{
		{Key: "$set", Value: bson.D{
			{Key: "state", Value: StateRunning}, {Key: "owner", Value: owner}, {Key: "epoch", Value: cw.epoch},
			{Key: "started", Value: now}, {Key: claimField, Value: cw.id},
		}},
		{Key: "$inc", Value: bson.D{{Key: "attempt", Value: 1}}},
	}
	return cw
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
// as read: it carries the claim id the claim was conditioned on, in a
// state a claim takes, claimed by no newer holder of the key.
func (cw *claimWrite) couldLandOn(j *Job) bool {
	for _, job := range cw.jobs {
		if job.ID == j.ID {
			return j.Claim == job.cl.prior && !finished(j.State) && j.Epoch <= cw.epoch
		}
	}
	return false
}

// leaseTime is the condition that this hold's lease has not expired, where
// the server judges its expiry ($$NOW): the lease's Fence without the
// conditions on the key's document. Elsewhere it is empty.
func (c *claim) leaseTime() bson.D {
	for _, e := range c.l.Fence() {
		if e.Key == "$expr" {
			return bson.D{e}
		}
	}
	return nil
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

// byClaim is the condition that each of jobs carries the claim id of(job)
// gives (zero: none), to add to a filter of their ids: one condition on c
// when they share it, else one per id.
func byClaim(jobs []*Job, of func(*Job) bson.ObjectID) bson.D {
	var order []bson.ObjectID
	groups := map[bson.ObjectID]bson.A{}
	for _, job := range jobs {
		id := of(job)
		if _, ok := groups[id]; !ok {
			order = append(order, id)
		}
		groups[id] = append(groups[id], job.ID)
	}
	carries := func(id bson.ObjectID) bson.E {
		if id.IsZero() {
			return bson.E{Key: claimField, Value: bson.D{{Key: "$exists", Value: false}}}
		}
		return bson.E{Key: claimField, Value: id}
	}
	if len(order) == 1 {
		return bson.D{carries(order[0])}
	}
	or := make(bson.A, 0, len(order))
	for _, id := range order {
		or = append(or, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: groups[id]}}}, carries(id)})
	}
	return bson.D{{Key: "$or", Value: or}}
}

// underClaim is the filter of jobs running under this worker's claim of
// each: the filter of every write that acts on a claimed job.
func underClaim(jobs []*Job) bson.D {
	f := append(idsFilter(jobs), bson.E{Key: "state", Value: StateRunning})
	return append(f, byClaim(jobs, func(j *Job) bson.ObjectID { return j.cl.id })...)
}

// putBack returns claimed jobs to the available state without counting
// their attempts, and voids this worker's claim of each where it did not
// land: one command of two statements, in order, each conditioned on a
// claim's identity. The first sets a new claim id on a job that still
// carries the one its claim replaced (the claim did not land, and now no
// copy of it can); the second puts back a job running under its claim. A
// lost reply: a job that carries neither, landed; else live (sent again:
// each statement applies at most once). It reports whether it settled:
// false leaves a claim that may still land, so the key must not be
// released (its lease expires instead).
func (c *claim) putBack(jobs ...*Job) bool {
	if len(jobs) == 0 {
		return true
	}
	q := c.q
	ctx, cancel := c.book()
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
			SetFilter(append(idsFilter(jobs), byClaim(jobs, func(j *Job) bson.ObjectID { return j.cl.prior })...)).
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
		Read: func(ctx context.Context) ([]Job, error) { return q.settledJobs(ctx, append(ids[0], ids[1]...)) },
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
		c.warn("put_back", err)
		c.unsure = true
		return false
	}
	return true
}

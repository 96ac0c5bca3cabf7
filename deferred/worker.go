package deferred

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// Run works the queue until ctx ends: it finds keys with jobs ready to run,
// claims each (a lease on the key's document, renewed while it works), runs
// the key's jobs in sequence order and records each outcome, at most
// Options.Workers keys at once. Any number of processes may call Run on the
// same collections; within a process, call it once per Queue. It works only
// the jobs of the handlers registered on q. When ctx ends, Run stops
// claiming, cancels the handlers' contexts, puts an interrupted job back
// without counting its attempt, releases its claims and returns nil once
// every worker has stopped. It returns an error only when it cannot start:
// a nil ctx, no handler registered, indexes it could not make.
func (q *Queue) Run(ctx context.Context) error {
	if err := checkCtx(ctx, "run"); err != nil {
		return err
	}
	if len(q.handlerNames()) == 0 {
		return invalid("run", "handlers", "none registered", nil)
	}
	ttl, err := q.EnsureIndexes(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r := &runner{q: q, busy: map[string]bool{}, skip: map[string]time.Time{}, freed: make(chan struct{}, 1)}
	defer r.wg.Wait()
	nextSweep := q.local.Now()
	var lastLook time.Time
	for ctx.Err() == nil {
		// Look for work at most ten times per PollInterval.
		if gap := q.c.PollInterval/10 - q.local.Now().Sub(lastLook); gap > 0 {
			q.sleep(ctx, gap)
		}
		lastLook = q.local.Now()
		if lastLook.After(nextSweep) {
			if _, err := q.sweep(ctx, !ttl); err != nil && ctx.Err() == nil {
				q.failed(ctx, "sweep", bson.RawValue{}, err)
			}
			nextSweep = q.local.Now().Add(min(max(q.c.Retention/2, q.c.PollInterval), time.Minute))
		}
		started, err := r.dispatch(ctx)
		if err != nil && ctx.Err() == nil {
			q.failed(ctx, "look_for_work", bson.RawValue{}, err)
		}
		if started > 0 {
			continue
		}
		// Jittered, so that the polls of many processes spread out.
		wait := q.local.NewTimer(q.c.PollInterval/2 + time.Duration(rand.Int64N(int64(q.c.PollInterval)+1)))
		select {
		case <-ctx.Done():
		case <-q.wake:
		case <-r.freed:
		case <-wait.C():
		}
		wait.Stop()
	}
	return nil
}

// runner is one Run: the keys its workers hold, and those it skips a while.
type runner struct {
	q     *Queue
	wg    sync.WaitGroup
	mu    sync.Mutex
	busy  map[string]bool      // keys a worker of this Run works on
	skip  map[string]time.Time // keys to leave alone until then
	freed chan struct{}
}

// dispatch starts a worker on each ready key it finds, up to the free
// workers, and returns how many it started.
func (r *runner) dispatch(ctx context.Context) (int, error) {
	q := r.q
	r.mu.Lock()
	free := q.c.Workers - len(r.busy)
	exclude := len(r.busy) + len(r.skip)
	now := q.local.Now()
	for k, until := range r.skip {
		if now.After(until) {
			delete(r.skip, k)
		}
	}
	r.mu.Unlock()
	if free <= 0 {
		return 0, nil
	}
	// More candidates than workers, shuffled: processes pick different keys.
	keys, err := q.candidates(ctx, int64(4*q.c.Workers+exclude))
	if err != nil {
		return 0, err
	}
	rand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	started := 0
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		if started == free {
			break
		}
		id := string(k.Value) + string(rune(k.Type))
		if r.busy[id] || !r.skip[id].IsZero() {
			continue
		}
		r.busy[id] = true
		started++
		r.wg.Go(func() {
			skip := q.work(ctx, k)
			r.mu.Lock()
			delete(r.busy, id)
			if skip {
				r.skip[id] = q.local.Now().Add(q.c.PollInterval)
			}
			r.mu.Unlock()
			select {
			case r.freed <- struct{}{}:
			default:
			}
		})
	}
	return started, nil
}

// keyHandler is the field of a key's document naming its head's handler,
// set by a process that lacks it (see noHead).
const keyHandler = "h"

// handlerNames returns the names of the handlers registered on q.
func (q *Queue) handlerNames() bson.A {
	q.mu.RLock()
	defer q.mu.RUnlock()
	names := make(bson.A, 0, len(q.handlers))
	for name := range q.handlers {
		names = append(names, name)
	}
	return names
}

// candidates returns up to limit keys with jobs waiting, whose head is due,
// of a handler not known to be missing here, and whose claim looks free or
// expired: a hint; the claim decides.
func (q *Queue) candidates(ctx context.Context, limit int64) ([]bson.RawValue, error) {
	now := q.now(ctx)
	filter := bson.D{
		{Key: "n", Value: bson.D{{Key: "$gt", Value: 0}}},
		{Key: "due", Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: now}}}}},
		{Key: "$and", Value: bson.A{
			bson.D{{Key: "$or", Value: bson.A{
				bson.D{{Key: keyHandler, Value: bson.D{{Key: "$exists", Value: false}}}},
				bson.D{{Key: keyHandler, Value: bson.D{{Key: "$in", Value: q.handlerNames()}}}},
			}}},
			q.unheld(now),
		}},
	}
	cur, err := q.keys.Find(ctx, filter, options.Find().
		SetProjection(bson.D{{Key: "_id", Value: 1}}).SetSort(bson.D{{Key: "t", Value: 1}}).SetLimit(limit))
	if err != nil {
		return nil, err
	}
	var docs []bson.Raw
	if err := cur.All(ctx, &docs); err != nil {
		return nil, err
	}
	keys := make([]bson.RawValue, 0, len(docs))
	for _, d := range docs {
		keys = append(keys, d.Lookup("_id"))
	}
	return keys, nil
}

// unheld matches a key whose claim (lease.Manager.Field) is free, or
// expired by the estimate now.
func (q *Queue) unheld(now time.Time) bson.D {
	return bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: q.leases.Field() + ".owner", Value: nil}},
		bson.D{{Key: q.leases.Field() + ".expiresAt", Value: bson.D{{Key: "$lt", Value: now}}}},
	}}}
}

// claim is a worker's hold on one key.
type claim struct {
	q    *Queue
	key  bson.RawValue
	l    *lease.Lease
	run  context.Context // Run's context
	jobs context.Context // ends with the lease or with Run's context
	skip bool            // this Run should leave the key alone a while
	// unsure: a claim of a job may still land (its putBack did not
	// settle), so the key is not released: its lease expires instead.
	unsure bool
	ran    time.Duration // how long the handler of the current attempt ran
}

// book returns the context of a bookkeeping write: ResolveTimeout past Run's.
func (c *claim) book() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(c.run), c.q.c.ResolveTimeout)
}

// lost reports whether the claim is known to be lost.
func (c *claim) lost() bool { return c.l.Err() != nil }

// work claims key and runs its jobs; it reports whether this Run should
// leave the key alone a poll interval.
func (q *Queue) work(ctx context.Context, key bson.RawValue) (skip bool) {
	l, err := q.leases.TryAcquire(ctx, key)
	if err != nil {
		if !errors.Is(err, lease.ErrHeld) && ctx.Err() == nil {
			q.failed(ctx, "claim_key", key, err)
		}
		return true
	}
	jobs, cancel := context.WithCancel(l.Context())
	stop := context.AfterFunc(ctx, cancel)
	c := &claim{q: q, key: key, l: l, run: ctx, jobs: jobs}
	var renewing sync.WaitGroup
	renewing.Go(func() { l.KeepAlive(jobs) }) // renewals, retried soon after a transient failure
	defer func() {
		stop()
		cancel()
		if !c.unsure {
			bctx, done := c.book()
			if err := l.Release(bctx); err != nil && !errors.Is(err, lease.ErrLost) {
				q.failed(ctx, "release_key", key, err)
			}
			done()
		}
		renewing.Wait()
	}()
	c.loop()
	return c.skip
}

// loop runs the key's jobs in order, at most Batch of them, while the claim
// holds and Run's context lives: a run of due jobs at a time (runOf), or
// the head alone (step).
func (c *claim) loop() {
	q := c.q
	ctx, cancel := c.book()
	kd, err := retry.DoValue(ctx, q.c.Retry, func(ctx context.Context) (*keyDoc, error) { return q.readKey(ctx, c.key, false) })
	cancel()
	if err != nil || kd == nil {
		return
	}
	c.key = kd.ID // the form its places are made of
	for i := 0; i < q.c.Batch && kd.N > 0 && !c.lost() && c.run.Err() == nil; {
		next, n, ok := c.runOf(*kd, q.c.Batch-i)
		if ok && n == 0 {
			next, ok = c.noHead(*kd, kd.Off+kd.Done+1)
			n = 1
		}
		if !ok {
			return
		}
		kd, i = &next, i+n
	}
}

// runOf runs a run of the key's jobs from its head, up to limit: jobs at
// consecutive places, each due and of a handler registered here (cancelled
// ones between them passed over), of one handler when it runs them together
// (NewChange's). It claims them in one write, runs them in order, records
// the completed ones in one write and moves the head past them in one; a
// job that fails is recorded by after, and those behind it are put back. A
// job taken over from a lost worker, or at its last attempt, runs alone.
// The claim is fenced on the lease's epoch (a late copy changes nothing)
// and skips jobs this claim holds (a resent copy counts no attempt). It
// returns n 0 and ok when the head has nothing to claim: see noHead.
func (c *claim) runOf(kd keyDoc, limit int) (keyDoc, int, bool) {
	q := c.q
	head := kd.Off + kd.Done + 1
	ctx, cancel := c.book()
	defer cancel()
	jobs, span, err := c.ahead(ctx, head, limit, q.now(ctx))
	if err != nil || len(jobs) == 0 {
		return kd, 0, true
	}
	// A Change run is claimed whole (its one write applies it whole); a
	// handler's jobs one at a time: the first here, each next one by the
	// command that records the one before it (recordTaking).
	take := jobs[:1]
	if q.handler(jobs[0].Name).batch != nil {
		take = jobs
	}
	if c.lost() {
		return kd, 0, false
	}
	applied, err := c.take(c.newClaim(take, q.now(ctx)), nil)
	switch {
	case err != nil:
		// It may still land: void it, so that no copy can.
		c.warn("claim_job", err)
		c.putBack(take...)
		return kd, 0, false
	case !applied && len(take) == 1:
		return kd, 0, true // changed meanwhile: noHead looks
	case !applied:
		// One changed meanwhile (cancelled, say): give back, go one by one.
		c.putBack(take...)
		return c.runOf(kd, 1)
	}
	if job := jobs[0]; job.Attempt > job.MaxAttempts {
		job.att.mayHaveWritten()
		next, ok := c.finish(kd, job, outcome{dead: true, err: fmt.Errorf("attempt %d of %d did not report: its worker lost its claim on the key", job.Attempt-1, job.MaxAttempts)})
		return next, 1, ok
	}
	n, claimed, started, err := c.runJobs(jobs, len(take))
	if c.lost() {
		// The jobs claimed and never started go back (the filter on their
		// claim makes it harmless if the key's next holder claimed them
		// meanwhile); one whose handler ran (it failed, or its record did)
		// stays running for the next holder, and so does a NewChange run
		// whose one write was made.
		if claimed > started {
			c.putBack(jobs[started:claimed]...)
		}
		if err != nil && n < len(jobs) {
			c.interrupted(jobs[n]) // its handler ran: failed, or unrecorded
		} else {
			c.lostKey() // between jobs: none was running
		}
		return kd, n, false
	}
	if errors.Is(err, errOneByOne) && n == 0 {
		c.putBack(jobs[:claimed]...)
		return c.runOf(kd, 1)
	}
	var failed *Job
	rest := jobs[n:claimed]
	switch {
	case errors.Is(err, errUnrecorded):
		rest = rest[1:] // left running: its next holder takes it over
	case err != nil && !errors.Is(err, errOneByOne) && len(rest) > 0:
		failed, rest = rest[0], rest[1:]
	}
	if len(rest) > 0 {
		c.putBack(rest...)
	}
	next, ok := kd, c.run.Err() == nil && !errors.Is(err, errUnrecorded)
	if n > 0 {
		if n < len(jobs) {
			span = jobs[n].Seq - head
		}
		moved := false
		if c.record(jobs[:n], nil) {
			next, moved = c.advance(kd, span)
		}
		ok = ok && moved
	}
	switch {
	case failed != nil && ok:
		next, ok = c.after(next, failed, err)
		return next, n + 1, ok
	case failed != nil:
		c.putBack(failed)
	}
	return next, n, ok
}

// take sends cw, the claim of jobs read by ahead, and settles it; applied
// false means one of them changed meanwhile (nothing of this claim then
// holds but what putBack gives back); an error, that its outcome is
// unknown (putBack voids it). prior, if not nil, is the ambiguous error of
// a copy of cw sent already (see recordTaking).
func (c *claim) take(cw *claimWrite, prior error) (bool, error) {
	q := c.q
	ctx, cancel := c.book()
	defer cancel()
	ids := cw.ids()
	res, err := settle.Exec(ctx, q.settleConfig(), settle.Write[struct{}, []Job]{
		Send: sentOnce(prior, q.updated(q.jobs, cw.filter, cw.update, int64(len(cw.jobs)))),
		Read: func(ctx context.Context) ([]Job, error) { return q.settledJobs(ctx, ids) },
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
	c.took(cw)
	return true, nil
}

// took updates the jobs of cw, read by ahead, as claimed by it.
func (c *claim) took(cw *claimWrite) {
	for _, job := range cw.jobs {
		// Taken over from a lost worker, whose handler may have written.
		job.q, job.att = c.q, &attempt{may: job.State == StateRunning}
		job.State, job.Owner, job.Epoch, job.StartedAt, job.Claim = StateRunning, c.q.c.Owner, cw.epoch, cw.now, cw.id
		job.Attempt++
		c.claimed(job)
	}
}

// ahead reads the key's places from head on, up to limit, and returns the
// run runOf may claim among them, and how many places it spans.
func (c *claim) ahead(ctx context.Context, head int64, limit int, now time.Time) ([]*Job, int64, error) {
	q := c.q
	var docs []*Job
	err := q.try(ctx, func(ctx context.Context) error {
		filter := bson.D{{Key: "p", Value: bson.D{{Key: "$gte", Value: placeOf(c.key, head)}, {Key: "$lt", Value: placeOf(c.key, head+int64(limit))}}}}
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
		case finished(job.State) || job.Epoch > c.l.Epoch() || job.RunAt.After(now) || q.handler(job.Name) == nil:
		case job.State == StateRunning && job.Epoch == c.l.Epoch() && job.Owner == q.c.Owner:
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

// runJobs runs a run in order, of which the first claimed were claimed by
// runOf: in one call of its handler's batch function (NewChange's: one
// write, recorded with the run, claimed whole) or one call per job, each
// recorded before the next starts, by the command that claims the next
// (recordTaking), stopping at the first error, a claim that did not apply, a
// lost claim or Run's stop.
// It returns how many completed, with the error of the first that did not
// (errUnrecorded: its record failed), how many are claimed (or may be), and
// how many of them started (their handler or batch function was called).
func (c *claim) runJobs(jobs []*Job, claimed int) (n, _, started int, err error) {
	if h := c.q.handler(jobs[0].Name); h.batch != nil && len(jobs) > 1 {
		if c.lost() || c.run.Err() != nil {
			return 0, claimed, 0, nil // never started: runOf puts the run back
		}
		err = c.call(func(ctx context.Context) (err error) {
			n, err = h.batch(ctx, jobs)
			return err
		})
		return n, claimed, len(jobs), err
	}
	for ; n < len(jobs) && !c.lost() && c.run.Err() == nil; n++ {
		if n == claimed {
			cw := c.newClaim(jobs[n:n+1], c.q.now(c.run))
			claimed++ // runOf puts it back unless it runs
			if ok, err := c.take(cw, nil); err != nil || !ok {
				if err != nil {
					c.warn("claim_job", err)
				} else {
					claimed-- // it did not apply, and no copy of it can
				}
				return n, claimed, n, nil // the next run looks again
			}
		}
		job, h := jobs[n], c.q.handler(jobs[n].Name)
		if err := c.call(func(ctx context.Context) error { return h.run(ctx, job) }); err != nil {
			return n, claimed, n + 1, err
		}
		if n+1 == claimed && n+1 < len(jobs) && !c.lost() && c.run.Err() == nil {
			rec, next := c.recordTaking(jobs[n], jobs[n+1])
			if next != nextNotTaken {
				claimed++ // runOf puts it back unless it runs
			}
			switch {
			case !rec:
				return n, claimed, n + 1, errUnrecorded
			case next != nextTaken:
				return n + 1, claimed, n + 1, nil
			}
			continue
		}
		if !c.record(jobs[n:n+1], nil) {
			return n, claimed, n + 1, errUnrecorded
		}
	}
	return n, claimed, n, nil
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
func (c *claim) recordTaking(done, next *Job) (bool, nextClaim) {
	q := c.q
	ctx, cancel := c.book()
	defer cancel()
	now := q.now(ctx)
	cw := c.newClaim([]*Job{next}, now)
	var matched int64
	err := q.try(ctx, func(ctx context.Context) error {
		res, err := q.jobs.BulkWrite(ctx, []mongo.WriteModel{
			mongo.NewUpdateOneModel().SetFilter(underClaim([]*Job{done})).SetUpdate(c.completed(done.att.wrote(), now)),
			mongo.NewUpdateOneModel().SetFilter(cw.filter).SetUpdate(cw.update),
		})
		if err == nil {
			matched = res.MatchedCount
		}
		return err
	})
	if err == nil && matched == 2 {
		c.wasRecorded([]*Job{done})
		c.took(cw)
		return true, nextTaken
	}
	var prior error // the record and the claim are each a write sent once: their reply was lost
	recorded, taken := false, false
	if store.IsAmbiguous(err) {
		prior = err
	} else {
		// The reply says what applied, not which: read the two.
		cur, rerr := settle.Reread(ctx, q.settleConfig(), func(ctx context.Context) ([]Job, error) {
			return q.settledJobs(ctx, bson.A{done.ID, next.ID})
		})
		if rerr != nil {
			c.warn("record_attempt", rerr)
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
		c.wasRecorded([]*Job{done})
	case !c.record([]*Job{done}, prior):
		// Unrecorded: done stays running for the key's next holder; next,
		// which never starts here, goes back if the claim may have applied.
		if taken || prior != nil {
			return false, nextUnsure
		}
		return false, nextNotTaken
	}
	if taken {
		c.took(cw)
		return true, nextTaken
	}
	ok, err := c.take(cw, prior)
	switch {
	case ok:
		return true, nextTaken
	case err != nil:
		c.warn("claim_job", err)
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
func (c *claim) record(jobs []*Job, prior error) bool {
	jobs = slices.DeleteFunc(slices.Clone(jobs), func(j *Job) bool { return j.State == StateCompleted })
	if len(jobs) == 0 {
		return true
	}
	q := c.q
	ctx, cancel := c.book()
	defer cancel()
	now := q.now(ctx)
	ok, err := c.updateJobs(ctx, jobs, StateCompleted, func(mw bool) bson.D { return c.completed(mw, now) }, prior)
	if err != nil || !ok {
		c.warn("record_attempt", err)
		return false
	}
	c.wasRecorded(jobs)
	return true
}

// completed is the update that records jobs completed at now (mw: their
// attempts may have written).
func (c *claim) completed(mw bool, now time.Time) bson.D {
	return bson.D{{Key: "$set", Value: jobSet(mw, bson.E{Key: "state", Value: StateCompleted}, bson.E{Key: "finished", Value: now},
		bson.E{Key: "expireAt", Value: now.Add(c.q.c.Retention)})}}
}

// wasRecorded marks jobs as recorded completed.
func (c *claim) wasRecorded(jobs []*Job) {
	for _, job := range jobs {
		job.State = StateCompleted
		c.recorded(job, outcome{}, StateCompleted, 0)
	}
}

// after records the outcome err of job's attempt, which this claim ran, and
// moves the head on as the outcome says.
func (c *claim) after(kd keyDoc, job *Job, err error) (keyDoc, bool) {
	switch {
	case c.lost():
		c.interrupted(job)
		return kd, false
	case err == nil:
		return c.finish(kd, job, outcome{})
	case c.run.Err() != nil:
		// Run is stopping: not the job's fault.
		c.putBack(job)
		return kd, false
	}
	var snooze *snoozeError
	if errors.As(err, &snooze) {
		if next, ok := c.finish(kd, job, outcome{snoozed: true, snooze: snooze.d}); ok || c.lost() {
			return next, ok
		}
		return c.recheck(kd, job.Seq) // finish set the key's due
	}
	// Bad input fails every attempt alike: dead at once.
	dead := retry.IsPermanent(err) || errors.Is(err, ErrInvalid) || job.Attempt >= job.MaxAttempts
	next, ok := c.finish(kd, job, outcome{dead: dead, err: err})
	if dead || ok || c.lost() {
		return next, ok
	}
	return c.recheck(kd, job.Seq) // finish set the key's due
}

// recheck reads the head at seq after this claim set the key's due, and
// moves the head on if it is finished: a Cancel whose clearing of due came
// before this claim's due is seen by this read (DESIGN.md, Running a key).
func (c *claim) recheck(kd keyDoc, seq int64) (keyDoc, bool) {
	ctx, cancel := c.book()
	job, err := c.head(ctx, seq)
	cancel()
	if err == nil && job != nil && finished(job.State) && !c.lost() {
		return c.advance(kd, 1)
	}
	return kd, false
}

// call runs fn, a handler's work, with the attempt's context, and turns a
// panic into a *PanicError.
func (c *claim) call(fn func(ctx context.Context) error) (err error) {
	defer c.timed(c.q.local.Now())
	ctx, cancel := c.jobs, context.CancelFunc(func() {})
	if c.q.c.JobTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.q.c.JobTimeout)
	}
	defer cancel()
	defer recoverPanic(&err)
	return fn(ctx)
}

// recoverPanic, deferred, turns a panic into a *PanicError in *err.
func recoverPanic(err *error) {
	if r := recover(); r != nil {
		stack := debug.Stack()
		if len(stack) > 4096 {
			stack = stack[:4096]
		}
		*err = &PanicError{Value: r, Stack: string(stack)}
	}
}

// head reads the job at seq on the claim's key: nil when there is none.
func (c *claim) head(ctx context.Context, seq int64) (*Job, error) {
	job := new(Job)
	return found(job, c.q.try(ctx, func(ctx context.Context) error { return c.q.jobs.FindOne(ctx, at(c.key, seq)).Decode(job) }))
}

// noHead handles a head seq with no job to claim: finished already (its
// worker died before moving the head), claimed under a newer lease, of a
// handler this process lacks, not due, or not there (a hole: DESIGN.md).
func (c *claim) noHead(kd keyDoc, seq int64) (keyDoc, bool) {
	q := c.q
	ctx, cancel := c.book()
	defer cancel()
	job, err := c.head(ctx, seq)
	now := q.now(ctx)
	switch {
	case err != nil:
		c.warn("read_head", err)
		return kd, false
	case job == nil:
	case finished(job.State):
		return c.advance(kd, 1)
	case job.Epoch > c.l.Epoch():
		// Claimed by a newer holder of the key: this claim is lost.
		return kd, false
	case q.handler(job.Name) == nil:
		// A handler this process lacks: name it on the key (the search of
		// such processes skips it) and skip it here a poll interval anyway.
		c.skip = true
		c.skipped(job)
		c.setKey(bson.D{{Key: keyHandler, Value: job.Name}})
		return kd, false
	default:
		// Not due yet: give the key up until then.
		c.setKey(bson.D{{Key: "due", Value: job.RunAt}})
		return c.recheck(kd, seq)
	}
	// No job yet: most often its enqueuer is between its two writes.
	since := now
	if kd.Hole != nil && kd.Hole.Seq == seq {
		since = kd.Hole.Since
	} else {
		c.setKey(bson.D{{Key: "hole", Value: hole{Seq: seq, Since: now}}})
	}
	if now.Sub(since) < q.c.HoleTimeout {
		for d := 5 * time.Millisecond; d <= 80*time.Millisecond; d *= 2 {
			q.sleep(c.jobs, d)
			if c.lost() || c.run.Err() != nil {
				return kd, false
			}
			if n, err := q.jobs.CountDocuments(ctx, at(c.key, seq)); err == nil && n > 0 {
				return kd, true // it landed: look again
			}
		}
		wait := min(max(now.Sub(since), q.c.PollInterval/10), since.Add(q.c.HoleTimeout).Sub(now))
		c.setKey(bson.D{{Key: "due", Value: now.Add(wait)}})
		return kd, false
	}
	// Missing for HoleTimeout: skip it (a late insert then fails on the index).
	if err := q.tombstone(ctx, c.key, seq); err != nil && !store.IsDuplicateKey(err) {
		c.warn("skip_hole", err)
		return kd, false
	}
	return kd, true
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
func (c *claim) finish(kd keyDoc, job *Job, o outcome) (keyDoc, bool) {
	q := c.q
	ctx, cancel := c.book()
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
	ok, err := c.updateJobs(ctx, []*Job{job}, to, func(bool) bson.D { return update }, nil)
	cancel()
	if err != nil || !ok {
		if err != nil {
			c.warn("record_attempt", err)
		}
		return kd, false
	}
	c.recorded(job, o, to, runAt.Sub(now))
	if !runAt.IsZero() {
		c.setKey(bson.D{{Key: "due", Value: runAt}})
		return kd, false
	}
	return c.advance(kd, 1)
}

// jobSet is the $set of a job's record: set, and mw when its attempt may
// have written (sticky: never unset).
func jobSet(mw bool, set ...bson.E) bson.D {
	if mw {
		set = append(set, bson.E{Key: "mw", Value: true})
	}
	return set
}

// delay returns the backoff before the attempt after attempt n.
func (q *Queue) delay(n int) time.Duration {
	b := q.c.Backoff.NewBackoff()
	var d time.Duration
	for range max(n, 1) {
		d = b.Next()
	}
	return d
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
func (c *claim) updateJobs(ctx context.Context, jobs []*Job, to State, update func(mw bool) bson.D, prior error) (bool, error) {
	q := c.q
	var groups [2][]*Job
	var ids bson.A
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
		Read: func(ctx context.Context) ([]Job, error) { return q.settledJobs(ctx, ids) },
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

// advance moves the key's head past its next m places, fenced on this
// claim and on the head's position: a resent copy, or a worker that lost
// the key, moves nothing.
func (c *claim) advance(kd keyDoc, m int64) (keyDoc, bool) {
	q := c.q
	ctx, cancel := c.book()
	defer cancel()
	now := q.now(ctx)
	filter := append(append(store.IDFilter(c.key), bson.E{Key: "done", Value: kd.Done}), c.l.Fence()...)
	update := bson.D{
		{Key: "$inc", Value: bson.D{{Key: "done", Value: m}, {Key: "n", Value: -m}}},
		{Key: "$set", Value: bson.D{{Key: "t", Value: now}}},
		{Key: "$unset", Value: bson.D{{Key: "due", Value: ""}, {Key: "hole", Value: ""}, {Key: keyHandler, Value: ""}}},
	}
	res, err := settle.Exec(ctx, q.settleConfig(), settle.Write[*keyDoc, *keyDoc]{
		// Matching nothing, the fence failed: the claim is lost.
		Send: modified[keyDoc](q, q.keys, filter, update, options.After),
		Read: func(ctx context.Context) (*keyDoc, error) { return q.readKey(ctx, c.key, true) },
		Judge: func(cur *keyDoc) (settle.Verdict, string) {
			return verdict(cur != nil && cur.Done >= kd.Done+m, cur != nil)
		},
		Resend: true,
	})
	switch {
	case err != nil:
		c.warn("move_head", err)
		return kd, false
	case res.Applied:
		return *shown(res), !c.lost()
	}
	return kd, false
}

// setKey sets fields of the key's document under this claim's fence.
func (c *claim) setKey(set bson.D) {
	ctx, cancel := c.book()
	defer cancel()
	filter := append(store.IDFilter(c.key), c.l.Fence()...)
	t := c.q.now(ctx).Truncate(time.Millisecond) // as stored
	set = append(set, bson.E{Key: "t", Value: t})
	// $set is idempotent; the time it sets tells whether it landed.
	_, err := settle.Exec(ctx, c.q.settleConfig(), settle.Write[struct{}, *keyDoc]{
		Send:   c.q.updated(c.q.keys, filter, bson.D{{Key: "$set", Value: set}}, 1),
		Read:   func(ctx context.Context) (*keyDoc, error) { return c.q.readKey(ctx, c.key, true) },
		Judge:  func(kd *keyDoc) (settle.Verdict, string) { return verdict(kd != nil && kd.T.Equal(t), kd != nil) },
		Resend: true,
	})
	if err != nil {
		c.warn("update_key", err)
	}
}

// Sweep deletes, in two deleteMany, the completed and cancelled jobs (and
// the tombstones of skipped numbers) whose retention has passed, and the
// documents of keys idle for Retention, and returns how many jobs it
// deleted. Run calls it (where a TTL index deletes the jobs, for idle keys
// only). A key whose document was deleted starts again above its old
// numbers.
func (q *Queue) Sweep(ctx context.Context) (int64, error) {
	if err := checkCtx(ctx, "sweep"); err != nil {
		return 0, err
	}
	return q.sweep(ctx, true)
}

func (q *Queue) sweep(ctx context.Context, jobs bool) (int64, error) {
	now := q.now(ctx)
	var n int64
	if jobs {
		res, err := q.jobs.DeleteMany(ctx, bson.D{{Key: "expireAt", Value: bson.D{{Key: "$lt", Value: now}}}})
		if err != nil {
			return 0, fmt.Errorf("deferred: sweep: %w", err)
		}
		n = res.DeletedCount
	}
	// Idle: nothing waiting, worked (t) or made (off) over Retention ago, not held.
	idle := now.Add(-q.c.Retention)
	_, err := q.keys.DeleteMany(ctx, bson.D{
		{Key: "n", Value: int64(0)},
		{Key: "$and", Value: bson.A{
			bson.D{{Key: "$or", Value: bson.A{
				bson.D{{Key: "t", Value: bson.D{{Key: "$lt", Value: idle}}}},
				bson.D{{Key: "t", Value: bson.D{{Key: "$exists", Value: false}}}, {Key: "off", Value: bson.D{{Key: "$lt", Value: idle.UnixMicro()}}}},
			}}},
			q.unheld(now),
		}},
	})
	if err != nil {
		return n, fmt.Errorf("deferred: sweep keys: %w", err)
	}
	return n, nil
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

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
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/retry"
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

// hold is a worker's hold on one key: its lease, under which it makes the
// claims of the key's jobs (claim.go).
type hold struct {
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
func (h *hold) book() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(h.run), h.q.c.ResolveTimeout)
}

// lost reports whether the claim is known to be lost.
func (h *hold) lost() bool { return h.l.Err() != nil }

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
	h := &hold{q: q, key: key, l: l, run: ctx, jobs: jobs}
	var renewing sync.WaitGroup
	renewing.Go(func() { l.KeepAlive(jobs) }) // renewals, retried soon after a transient failure
	defer func() {
		stop()
		cancel()
		if !h.unsure {
			bctx, done := h.book()
			if err := l.Release(bctx); err != nil && !errors.Is(err, lease.ErrLost) {
				q.failed(ctx, "release_key", key, err)
			}
			done()
		}
		renewing.Wait()
	}()
	h.loop()
	return h.skip
}

// loop runs the key's jobs in order, at most Batch of them, while the claim
// holds and Run's context lives: a run of due jobs at a time (runOf), or
// the head alone (step).
func (h *hold) loop() {
	q := h.q
	ctx, cancel := h.book()
	kd, err := retry.DoValue(ctx, q.c.Retry, func(ctx context.Context) (*keyDoc, error) { return q.readKey(ctx, h.key, false) })
	cancel()
	if err != nil || kd == nil {
		return
	}
	h.key = kd.ID // the form its places are made of
	for i := 0; i < q.c.Batch && kd.N > 0 && !h.lost() && h.run.Err() == nil; {
		next, n, ok := h.runOf(*kd, q.c.Batch-i)
		if ok && n == 0 {
			next, ok = h.noHead(*kd, kd.Off+kd.Done+1)
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
func (h *hold) runOf(kd keyDoc, limit int) (keyDoc, int, bool) {
	q := h.q
	head := kd.Off + kd.Done + 1
	ctx, cancel := h.book()
	defer cancel()
	jobs, span, err := h.ahead(ctx, head, limit, q.now(ctx))
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
	if h.lost() {
		return kd, 0, false
	}
	applied, err := h.take(h.newClaim(take, q.now(ctx)), nil)
	switch {
	case err != nil:
		// It may still land: void it, so that no copy can.
		h.warn("claim_job", err)
		h.putBack(take...)
		return kd, 0, false
	case !applied && len(take) == 1:
		return kd, 0, true // changed meanwhile: noHead looks
	case !applied:
		// One changed meanwhile (cancelled, say): give back, go one by one.
		h.putBack(take...)
		return h.runOf(kd, 1)
	}
	if job := jobs[0]; job.Attempt > job.MaxAttempts {
		job.att.mayHaveWritten()
		next, ok := h.finish(kd, job, outcome{dead: true, err: fmt.Errorf("attempt %d of %d did not report: its worker lost its claim on the key", job.Attempt-1, job.MaxAttempts)})
		return next, 1, ok
	}
	n, claimed, started, err := h.runJobs(jobs, len(take))
	// ErrOneByOne means "the rest one at a time" only from a run function;
	// from a handler it is an error like any other, which fails the job.
	// Fewer than all with no error is ErrOneByOne: the rest go back.
	batched := len(take) > 1
	switch {
	case batched && (n < 0 || n > len(jobs)):
		n, err = 0, invalid("run", "handler", fmt.Sprintf("the run function of %q returned %d for a run of %d jobs", jobs[0].Name, n, len(jobs)), nil)
	case batched && n < len(jobs) && err == nil:
		err = errOneByOne
	}
	oneByOne := batched && errors.Is(err, errOneByOne)
	if h.lost() && batched {
		h.lostRun(jobs, n, err, oneByOne)
		return kd, n, false
	}
	if h.lost() {
		// The jobs claimed and never started go back (the filter on their
		// claim makes it harmless if the key's next holder claimed them
		// meanwhile); one whose handler ran (it failed, or its record did)
		// stays running for the next holder, and so does a NewChange run
		// whose one write was made.
		if claimed > started {
			h.putBack(jobs[started:claimed]...)
		}
		if err != nil && n < len(jobs) {
			h.interrupted(jobs[n]) // its handler ran: failed, or unrecorded
		} else {
			h.lostKey() // between jobs: none was running
		}
		return kd, n, false
	}
	if oneByOne && n == 0 {
		h.putBack(jobs[:claimed]...)
		return h.runOf(kd, 1)
	}
	var failed *Job
	rest := jobs[n:claimed]
	switch {
	case errors.Is(err, errUnrecorded):
		rest = rest[1:] // left running: its next holder takes it over
	case err != nil && !oneByOne && len(rest) > 0:
		failed, rest = rest[0], rest[1:]
	}
	if len(rest) > 0 {
		h.putBack(rest...)
	}
	next, ok := kd, h.run.Err() == nil && !errors.Is(err, errUnrecorded)
	if n > 0 {
		if n < len(jobs) {
			span = jobs[n].Seq - head
		}
		moved := false
		if h.record(jobs[:n], nil) {
			next, moved = h.advance(kd, span)
		}
		ok = ok && moved
	}
	switch {
	case failed != nil && ok:
		next, ok = h.after(next, failed, err)
		return next, n + 1, ok
	case failed != nil:
		h.putBack(failed)
	}
	return next, n, ok
}

// lostRun is what a worker that lost the key does with a run its run
// function was handed, once it returned n and err: the n jobs it completed
// are recorded (conditioned on this claim, as every record is: harmless if
// the key's next holder took them over), the one whose attempt failed, and
// any other that may have written, stay running for the next holder (which
// takes each over alone), and the others go back unattempted.
func (h *hold) lostRun(jobs []*Job, n int, err error, oneByOne bool) {
	if n > 0 {
		h.record(jobs[:n], nil)
	}
	rest := jobs[n:]
	if err != nil && !oneByOne && len(rest) > 0 {
		h.interrupted(rest[0])
		rest = rest[1:]
	} else {
		h.lostKey()
	}
	h.putBack(slices.DeleteFunc(slices.Clone(rest), func(j *Job) bool { return j.att.wrote() })...)
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
func (h *hold) runJobs(jobs []*Job, claimed int) (n, _, started int, err error) {
	if hd := h.q.handler(jobs[0].Name); hd.batch != nil && len(jobs) > 1 {
		if h.lost() || h.run.Err() != nil {
			return 0, claimed, 0, nil //nolint:nilerr // Run's stop or a lost key is not the run's error: never started, runOf puts it back
		}
		err = h.call(func(ctx context.Context) (err error) {
			n, err = hd.batch(ctx, jobs)
			return err
		})
		return n, claimed, len(jobs), err
	}
	for ; n < len(jobs) && !h.lost() && h.run.Err() == nil; n++ {
		if n == claimed {
			cw := h.newClaim(jobs[n:n+1], h.q.now(h.run))
			claimed++ // runOf puts it back unless it runs
			if ok, err := h.take(cw, nil); err != nil || !ok {
				if err != nil {
					h.warn("claim_job", err)
				} else {
					claimed-- // it did not apply, and no copy of it can
				}
				return n, claimed, n, nil // the next run looks again
			}
		}
		job, hd := jobs[n], h.q.handler(jobs[n].Name)
		if err := h.call(func(ctx context.Context) error { return hd.run(ctx, job) }); err != nil {
			return n, claimed, n + 1, err
		}
		if n+1 == claimed && n+1 < len(jobs) && !h.lost() && h.run.Err() == nil {
			rec, next := h.recordTaking(jobs[n], jobs[n+1])
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
		if !h.record(jobs[n:n+1], nil) {
			return n, claimed, n + 1, errUnrecorded
		}
	}
	return n, claimed, n, nil
}

// after records the outcome err of job's attempt, which this claim ran, and
// moves the head on as the outcome says.
func (h *hold) after(kd keyDoc, job *Job, err error) (keyDoc, bool) {
	switch {
	case h.lost():
		h.interrupted(job)
		return kd, false
	case err == nil:
		return h.finish(kd, job, outcome{})
	case h.run.Err() != nil:
		// Run is stopping: not the job's fault.
		h.putBack(job)
		return kd, false
	}
	var snooze *snoozeError
	if errors.As(err, &snooze) {
		if next, ok := h.finish(kd, job, outcome{snoozed: true, snooze: snooze.d}); ok || h.lost() {
			return next, ok
		}
		return h.recheck(kd, job.Seq) // finish set the key's due
	}
	// Bad input fails every attempt alike: dead at once.
	dead := retry.IsPermanent(err) || errors.Is(err, ErrInvalid) || job.Attempt >= job.MaxAttempts
	next, ok := h.finish(kd, job, outcome{dead: dead, err: err})
	if dead || ok || h.lost() {
		return next, ok
	}
	return h.recheck(kd, job.Seq) // finish set the key's due
}

// call runs fn, a handler's work, with the attempt's context, and turns a
// panic into a *PanicError.
func (h *hold) call(fn func(ctx context.Context) error) (err error) {
	defer h.timed(h.q.local.Now())
	ctx, cancel := h.jobs, context.CancelFunc(func() {})
	if h.q.c.JobTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, h.q.c.JobTimeout)
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

// delay returns the backoff before the attempt after attempt n.
func (q *Queue) delay(n int) time.Duration {
	b := q.c.Backoff.NewBackoff()
	var d time.Duration
	for range max(n, 1) {
		d = b.Next()
	}
	return d
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

package observe

import (
	"context"
	"fmt"
	"reflect"
	"sync/atomic"
)

// Counters is an Observer that counts the events it sees: by kind, the
// settled ambiguous writes by settlement, and the operations that failed.
// The zero value is ready to use; a Counters is safe for concurrent use and
// allocates nothing per event. Give the same *Counters to every repository
// and manager whose events it should add up, and read it at any time:
//
//	var counts observe.Counters
//	repo, err := versioned.New[Item](coll, &versioned.Options{Observer: &counts})
//	...
//	fmt.Println(counts.String())
type Counters struct {
	kinds   [kindEnd]atomic.Int64
	settled [SettledUnknown + 1]atomic.Int64
	failed  atomic.Int64
}

// Start counts an OpStart event and returns ctx.
func (c *Counters) Start(ctx context.Context, e Event) context.Context {
	c.Observe(ctx, e)
	return ctx
}

// Observe counts e.
func (c *Counters) Observe(_ context.Context, e Event) {
	if e.Kind > 0 && e.Kind < kindEnd {
		c.kinds[e.Kind].Add(1)
	}
	switch {
	case e.Kind == Settled && e.Settlement > 0 && e.Settlement <= SettledUnknown:
		c.settled[e.Settlement].Add(1)
	case e.Kind == OpEnd && e.Outcome.Failed():
		c.failed.Add(1)
	}
}

// Count returns how many events of kind k were seen.
func (c *Counters) Count(k Kind) int64 {
	if k > 0 && k < kindEnd {
		return c.kinds[k].Load()
	}
	return 0
}

// Settled returns how many ambiguous writes were settled as s.
func (c *Counters) Settled(s Settlement) int64 {
	if s > 0 && s <= SettledUnknown {
		return c.settled[s].Load()
	}
	return 0
}

// Failed returns how many operations ended with an Outcome that Failed.
func (c *Counters) Failed() int64 { return c.failed.Load() }

// Counts returns a snapshot of the counts, each read on its own.
func (c *Counters) Counts() Counts {
	return Counts{
		Operations:     c.Count(OpStart),
		Failed:         c.Failed(),
		Conflicts:      c.Count(Conflict),
		Retries:        c.Count(Retry),
		BudgetRefusals: c.Count(BudgetRefused),
		Ambiguous:      c.Count(Ambiguous),
		Landed:         c.Settled(SettledLanded),
		Resent:         c.Settled(SettledResent),
		NotLanded:      c.Settled(SettledNotLanded),
		Unknown:        c.Settled(SettledUnknown),
		LeasesAcquired: c.Count(LeaseAcquired),
		LeasesHeld:     c.Count(LeaseHeld),
		LeasesRenewed:  c.Count(LeaseRenewed),
		RenewalsFailed: c.Count(LeaseRenewFailed),
		LeasesLost:     c.Count(LeaseLost),
		LeasesReleased: c.Count(LeaseReleased),
		ClockSyncs:     c.Count(ClockSync),
		JobsEnqueued:   c.Count(JobEnqueued),
		JobsClaimed:    c.Count(JobClaimed),
		JobsCompleted:  c.Count(JobCompleted),
		JobsFailed:     c.Count(JobFailed),
		JobsDead:       c.Count(JobDead),
		JobsSnoozed:    c.Count(JobSnoozed),
		JobsRequeued:   c.Count(JobRequeued),
		JobsCancelled:  c.Count(JobCancelled),
		KeysSkipped:    c.Count(QueueKeySkipped),
		QueueErrors:    c.Count(QueueError),
		KeysCompleted:  c.Count(KeyCompleted),
		KeysReplayed:   c.Count(KeyReplayed),
		KeysInProgress: c.Count(KeyInProgress),
		KeysMismatched: c.Count(KeyMismatch),
		MovesDebited:   c.Count(MoveDebited),
		MovesDone:      c.Count(MoveDone),
		MovesReturned:  c.Count(MoveReturned),
	}
}

// String returns the counts on one line: c.Counts().String().
func (c *Counters) String() string { return c.Counts().String() }

// Counts is a snapshot of Counters: plain numbers, to print, add up (the
// counts of several processes, say) or encode as JSON.
type Counts struct {
	// Operations is the number of operations started (OpStart), and Failed
	// the number that ended with an Outcome that Failed.
	Operations, Failed int64
	// Conflicts, Retries and BudgetRefusals count those events.
	Conflicts, Retries, BudgetRefusals int64
	// Ambiguous counts ambiguous writes; Landed, Resent, NotLanded and
	// Unknown how they were settled.
	Ambiguous, Landed, Resent, NotLanded, Unknown int64
	// The lease events: acquired, found held by another owner, renewed,
	// renewals that failed, lost, released.
	LeasesAcquired, LeasesHeld, LeasesRenewed, RenewalsFailed, LeasesLost, LeasesReleased int64
	// ClockSyncs counts the syncs of server clocks.
	ClockSyncs int64
	// The job events of deferred queues: enqueued, claimed (attempts
	// started), completed, failed (attempts that will be tried again),
	// dead, snoozed, requeued, cancelled.
	JobsEnqueued, JobsClaimed, JobsCompleted, JobsFailed, JobsDead, JobsSnoozed, JobsRequeued, JobsCancelled int64
	// KeysSkipped counts the keys a queue's worker left to other processes
	// (QueueKeySkipped), QueueErrors the QueueError events.
	KeysSkipped, QueueErrors int64
	// The idempotency events: results stored, replayed, requests that found
	// their key in progress, keys reused with another request.
	KeysCompleted, KeysReplayed, KeysInProgress, KeysMismatched int64
	// The move events: debits landed, moves settled done, and returned.
	MovesDebited, MovesDone, MovesReturned int64
}

// Add returns the sum of c and o, field by field.
func (c Counts) Add(o Counts) Counts {
	sum, other := reflect.ValueOf(&c).Elem(), reflect.ValueOf(o)
	for i := range sum.NumField() {
		sum.Field(i).SetInt(sum.Field(i).Int() + other.Field(i).Int())
	}
	return c
}

// String returns the counts on one line, every count named, in the order of
// the fields; the job, idempotency and move counts only when any is not
// zero.
func (c Counts) String() string {
	s := fmt.Sprintf("operations %d (failed %d), conflicts %d, retries %d, budget refusals %d, "+
		"ambiguous writes %d (landed %d, resent %d, not landed %d, unknown %d), "+
		"leases acquired %d, held by another %d, renewed %d, renewals failed %d, lost %d, released %d, clock syncs %d",
		c.Operations, c.Failed, c.Conflicts, c.Retries, c.BudgetRefusals,
		c.Ambiguous, c.Landed, c.Resent, c.NotLanded, c.Unknown,
		c.LeasesAcquired, c.LeasesHeld, c.LeasesRenewed, c.RenewalsFailed, c.LeasesLost, c.LeasesReleased, c.ClockSyncs)
	if c.JobsEnqueued|c.JobsClaimed|c.JobsCompleted|c.JobsFailed|c.JobsDead|c.JobsSnoozed|c.JobsRequeued|c.JobsCancelled|c.KeysSkipped|c.QueueErrors != 0 {
		s += fmt.Sprintf(", jobs enqueued %d, claimed %d, completed %d, failed %d, dead %d, snoozed %d, requeued %d, cancelled %d, "+
			"keys skipped %d, queue errors %d",
			c.JobsEnqueued, c.JobsClaimed, c.JobsCompleted, c.JobsFailed, c.JobsDead, c.JobsSnoozed, c.JobsRequeued, c.JobsCancelled,
			c.KeysSkipped, c.QueueErrors)
	}
	if c.KeysCompleted|c.KeysReplayed|c.KeysInProgress|c.KeysMismatched != 0 {
		s += fmt.Sprintf(", idempotent requests completed %d, replayed %d, in progress %d, mismatched %d",
			c.KeysCompleted, c.KeysReplayed, c.KeysInProgress, c.KeysMismatched)
	}
	if c.MovesDebited|c.MovesDone|c.MovesReturned != 0 {
		s += fmt.Sprintf(", moves debited %d, done %d, returned %d", c.MovesDebited, c.MovesDone, c.MovesReturned)
	}
	return s
}

package observe

import (
	"context"
	"fmt"
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

// String returns the counts on one line, every count named, in a fixed
// order: operations (and how many failed), conflicts, retries, budget
// refusals, ambiguous writes (and how each was settled), then the lease
// events and clock syncs.
func (c *Counters) String() string {
	return fmt.Sprintf("operations %d (failed %d), conflicts %d, retries %d, budget refusals %d, "+
		"ambiguous writes %d (landed %d, resent %d, not landed %d, unknown %d), "+
		"leases acquired %d, held by another %d, renewed %d, renewals failed %d, lost %d, released %d, clock syncs %d",
		c.Count(OpStart), c.Failed(), c.Count(Conflict), c.Count(Retry), c.Count(BudgetRefused),
		c.Count(Ambiguous), c.Settled(SettledLanded), c.Settled(SettledResent), c.Settled(SettledNotLanded), c.Settled(SettledUnknown),
		c.Count(LeaseAcquired), c.Count(LeaseHeld), c.Count(LeaseRenewed), c.Count(LeaseRenewFailed), c.Count(LeaseLost), c.Count(LeaseReleased), c.Count(ClockSync))
}

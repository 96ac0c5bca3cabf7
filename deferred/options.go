package deferred

import (
	"fmt"
	"strings"
	"time"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// Defaults of the Options fields (each field says what it is).
const (
	DefaultWorkers           = 4
	DefaultVisibilityTimeout = 30 * time.Second
	DefaultMaxAttempts       = 10
	DefaultJobTimeout        = time.Minute
	DefaultPollInterval      = time.Second
	DefaultHoleTimeout       = 10 * time.Second
	DefaultRetention         = 24 * time.Hour
	DefaultBatch             = 100
	DefaultMaxStamps         = 10000
	DefaultFenceField        = "_deferred"
	DefaultResolveTimeout    = 5 * time.Second
)

// Options configures a Queue. A nil *Options means all defaults; each zero
// field takes its default.
type Options struct {
	// Workers is how many keys one Run works on at once: each worker holds
	// one key's claim and runs that key's jobs in order. Default 4.
	Workers int

	// VisibilityTimeout is the TTL of a worker's claim (a lease of the
	// lease package on the key's document). The worker renews it every
	// third of it while a handler runs; a worker that stops renewing
	// (killed, paused, cut off) loses the key after it, its handler's
	// context ends first, and another worker takes the job over. Default 30s.
	VisibilityTimeout time.Duration

	// MaxAttempts is how many times a job is tried before it is moved to the
	// dead state with its errors recorded. Default 10.
	MaxAttempts int

	// Backoff spaces the attempts of a failing job: the delay before
	// attempt n+1 is the n-th delay of Backoff.NewBackoff (full jitter
	// by default). Only its intervals, Multiplier, Jitter and Rand are
	// used. The zero Policy means InitialInterval 1s, MaxInterval 5m.
	Backoff retry.Policy

	// Retry is the policy of the version-conflict retries inside the
	// Modify helper, within one attempt (its versioned.WithRetry). Zero
	// fields mean the retry package's defaults (10 attempts, 2s), and a nil
	// Budget the repository's.
	Retry retry.Policy

	// JobTimeout bounds one attempt of a handler; the handler's context
	// ends then and the attempt fails. Default 1m. Negative means none
	// (the claim's renewals still bound nothing: a handler that never
	// returns holds its key).
	JobTimeout time.Duration

	// PollInterval is how often an idle Run looks for jobs enqueued by
	// other processes (jobs enqueued through this Queue wake it at once).
	// Default 1s.
	PollInterval time.Duration

	// HoleTimeout is how long a key waits for a job whose sequence number
	// was reserved but which was never inserted (its enqueuer died between
	// the two writes), before it skips that number. An enqueue still in
	// flight when its number is skipped reserves another: nothing is lost
	// or reordered, so this bounds only a stall. Default 10s.
	HoleTimeout time.Duration

	// Retention is how long completed and cancelled jobs are kept after
	// they finished, for inspection, before a TTL index (or Sweep, where
	// the server has none) deletes them, and how long a key with nothing to
	// run keeps its document in the keys collection before Sweep deletes it.
	// Dead jobs are kept until they are requeued or cancelled. Default 24h.
	Retention time.Duration

	// Batch is how many jobs of one key a worker runs while it holds the
	// key's claim, before it gives the key up so that other keys get their
	// turn; it claims, records and moves the head past a run of due jobs
	// in one write each. Default 100.
	Batch int

	// FenceField is the subdocument of a target document where Job.Stamp
	// records, per queue and key, the sequence number of the last job
	// applied to it. It must not start with "$" or contain ".". Default
	// "_deferred".
	FenceField string

	// MaxStamps is how many stamps (one per queue and key whose jobs wrote
	// it, about 40 bytes each) a target document may carry under
	// FenceField. A fenced write of Guarded or Modify that would add one
	// more is refused (ErrInvalid: the job is dead at once): the document
	// stays far below MongoDB's 16 MiB. Where the server has no $expr
	// (FerretDB v1) the bound is not enforced. Key the jobs that change one
	// shared document by that document (NewChange does), and it carries one
	// stamp per queue. Default 10,000 (about 400 KB).
	MaxStamps int

	// Owner identifies this Queue's workers in claims (the lease owner). It
	// must be unique among the processes that run the queue. Default: a
	// fresh "host/pid/random" string.
	Owner string

	// LeaseMode is how claims judge expiry (see lease.Mode): ModeAuto, the
	// default, uses the server's $$NOW where it has it.
	LeaseMode lease.Mode

	// Clock estimates the server's clock: claims in lease.ModeEstimated,
	// and the times of retries and of clean-up everywhere. Default: the
	// client's shared one (store.For(client).Clock()).
	Clock *store.ServerClock

	// ResolveTimeout bounds the re-reads that settle an ambiguous write, and
	// the bookkeeping a worker finishes after Run's context ended. Default
	// 5s.
	ResolveTimeout time.Duration

	// Observer, if not nil, receives the Queue's events (see the observe
	// package): each job enqueued, claimed (with its attempt and its age),
	// completed, failed (with its attempt and error), dead, snoozed,
	// requeued or cancelled; a key a worker leaves to other processes
	// (QueueKeySkipped); and, as QueueError, what the workers cannot
	// return to anyone (a failed search for work, sweep, claim, release or
	// bookkeeping write, a claim lost while a job ran). observe.Slog logs
	// them, warning of dead jobs, skipped keys and queue errors. The lease
	// Manager of the claims reports to it too, and the Retry policy of the
	// Modify helper, unless Retry has an Observer of its own. Nil means
	// none.
	Observer observe.Observer
}

// config returns o with the defaults filled in, or an *InvalidError.
func (o *Options) config() (Options, error) {
	var opts Options
	if o != nil {
		opts = *o
	}
	bad := func(field, reason string) (Options, error) {
		return Options{}, invalid("new", field, reason, nil)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"VisibilityTimeout", opts.VisibilityTimeout}, {"PollInterval", opts.PollInterval},
		{"HoleTimeout", opts.HoleTimeout}, {"Retention", opts.Retention}, {"ResolveTimeout", opts.ResolveTimeout},
	} {
		if d.v < 0 {
			return bad(d.name, fmt.Sprintf("negative duration %v", d.v))
		}
	}
	if opts.Workers < 0 || opts.MaxAttempts < 0 || opts.Batch < 0 || opts.MaxStamps < 0 {
		return bad("Workers, MaxAttempts, Batch or MaxStamps", "negative")
	}
	if err := opts.Backoff.Validate(); err != nil {
		return Options{}, invalid("new", "Backoff", "invalid policy", err)
	}
	if err := opts.Retry.Validate(); err != nil {
		return Options{}, invalid("new", "Retry", "invalid policy", err)
	}
	if strings.HasPrefix(opts.FenceField, "$") || strings.Contains(opts.FenceField, ".") {
		return bad("FenceField", fmt.Sprintf("%q starts with '$' or contains '.'", opts.FenceField))
	}
	if opts.Owner != "" && strings.TrimSpace(opts.Owner) == "" {
		return bad("Owner", "only spaces")
	}
	c := opts
	c.Workers, c.VisibilityTimeout = or(c.Workers, DefaultWorkers), or(c.VisibilityTimeout, DefaultVisibilityTimeout)
	c.MaxAttempts, c.JobTimeout = or(c.MaxAttempts, DefaultMaxAttempts), or(c.JobTimeout, DefaultJobTimeout)
	c.PollInterval, c.HoleTimeout = or(c.PollInterval, DefaultPollInterval), or(c.HoleTimeout, DefaultHoleTimeout)
	c.Retention, c.Batch = or(c.Retention, DefaultRetention), or(c.Batch, DefaultBatch)
	c.FenceField, c.MaxStamps = or(c.FenceField, DefaultFenceField), or(c.MaxStamps, DefaultMaxStamps)
	c.ResolveTimeout = or(c.ResolveTimeout, DefaultResolveTimeout)
	// The Modify helper's policy goes to versioned, whose zero fields
	// differ from the retry package's.
	c.Retry.MaxAttempts = or(c.Retry.MaxAttempts, retry.DefaultMaxAttempts)
	c.Retry.MaxElapsedTime = or(c.Retry.MaxElapsedTime, retry.DefaultMaxElapsedTime)
	c.Retry.Observer = or[observe.Observer](c.Retry.Observer, c.Observer)
	if c.Backoff.InitialInterval == 0 && c.Backoff.MaxInterval == 0 {
		c.Backoff.InitialInterval, c.Backoff.MaxInterval = time.Second, 5*time.Minute
	}
	return c, nil
}

// or returns v, or def when v is the zero value.
func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

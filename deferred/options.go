package deferred

import (
	"cmp"
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
	// Workers is how many keys one Run works on at once. Default 4.
	Workers int
	// VisibilityTimeout is the TTL of a worker's claim on a key (a lease),
	// renewed every third of it while it works: a worker that stops
	// renewing loses the key after it, its handler's context ending first.
	// Default 30s.
	VisibilityTimeout time.Duration
	// MaxAttempts is how many times a job is tried before it is dead, with
	// its errors recorded. Default 10.
	MaxAttempts int
	// Backoff spaces the attempts of a failing job: the delay before
	// attempt n+1 is the n-th delay of Backoff.NewBackoff (its intervals,
	// Multiplier, Jitter and Rand). The zero Policy means 1s to 5m.
	Backoff retry.Policy
	// Retry is the policy of the version-conflict retries of the Modify
	// helper within one attempt (versioned.WithRetry). Zero fields mean the
	// retry package's defaults, a nil Budget the repository's.
	Retry retry.Policy
	// JobTimeout bounds one attempt of a handler: its context ends then and
	// the attempt fails. Default 1m; negative means none.
	JobTimeout time.Duration
	// PollInterval is how often an idle Run looks for jobs enqueued by
	// other processes (this Queue's enqueues wake it at once). Default 1s.
	PollInterval time.Duration
	// HoleTimeout is how long a key waits for a job whose number was
	// reserved but never inserted (its enqueuer died) before skipping the
	// number; an enqueue still in flight then reserves another, so this
	// bounds only a stall. Default 10s.
	HoleTimeout time.Duration
	// Retention is how long completed and cancelled jobs are kept after
	// they finished (a TTL index or Sweep deletes them), and an idle key's
	// document. Dead jobs are kept until requeued or cancelled. Default 24h.
	Retention time.Duration
	// Batch is how many jobs of one key a worker runs per claim of the key,
	// a run of due jobs at a time (one read finds a run, one write moves
	// the head past it). Default 100.
	Batch int
	// FenceField is the subdocument of a target document where Job.Stamp
	// records, per queue and key, the last job applied to it. No "$"
	// prefix, no ".". Default "_deferred".
	FenceField string
	// MaxStamps is how many stamps (about 40 bytes each) a target document
	// may carry: a fenced write that would add one more is refused
	// (ErrInvalid: the job is dead at once). Not enforced where the server
	// has no $expr (FerretDB v1). Default 10,000.
	MaxStamps int
	// Owner identifies this Queue's workers in claims; unique among the
	// processes that run the queue. Default: a fresh "host/pid/random".
	Owner string
	// LeaseMode is how claims judge expiry (lease.Mode); ModeAuto uses the
	// server's $$NOW where it has it.
	LeaseMode lease.Mode
	// Clock estimates the server's clock (claims in lease.ModeEstimated,
	// the times of retries and clean-up). Default: the client's shared one.
	Clock *store.ServerClock
	// LocalClock is this process's clock: the durations, deadlines, waits
	// and timers of the workers, Wait and the claims' local deadlines (the
	// lease's Options.Now), and of Retry and Backoff where their own Clock
	// is nil. Only differences between its readings are used, never its
	// absolute value: server times come from Clock. Default
	// store.SystemClock(). Tests inject a manual clock here, so that they
	// never sleep on the wall clock.
	LocalClock store.Clock
	// ResolveTimeout bounds the re-reads that settle an ambiguous write, and
	// a worker's bookkeeping after Run's context ended. Default 5s.
	ResolveTimeout time.Duration
	// Observer, if not nil, receives the Queue's events: each job's life,
	// keys left to other processes (QueueKeySkipped), what the workers
	// cannot return to anyone (QueueError), the claims' lease events and
	// the Modify helper's retries (unless Retry has an Observer).
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
	if c.LocalClock == nil {
		c.LocalClock = store.SystemClock()
	} else {
		c.Retry.Clock = cmp.Or[store.Clock](c.Retry.Clock, c.LocalClock)
		c.Backoff.Clock = cmp.Or[store.Clock](c.Backoff.Clock, c.LocalClock)
	}
	// For versioned, whose zero fields differ from the retry package's:
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

package lease

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// Defaults of the Options fields.
const (
	// DefaultTTL is the TTL of a Manager made with nil Options.
	DefaultTTL = 30 * time.Second
	// DefaultField is the name of the lease subdocument.
	DefaultField = "_lease"
	// DefaultDriftRate is the assumed worst-case rate at which the server's
	// clock runs fast relative to the local monotonic clock (the same as
	// store.ClockOptions' default).
	DefaultDriftRate = 1e-4
	// DefaultCleanupAfter is how long a named lease's lock document stays
	// after its lease expired or was released before a TTL index may delete
	// it.
	DefaultCleanupAfter = 24 * time.Hour
)

// Options configures a Manager. A nil *Options means all defaults. In a
// non-nil Options, TTL must be set; every other zero field takes its default.
type Options struct {
	// TTL is how long a claim or renewal keeps the lease, on the server's
	// clock. Size it above the worst-case duration of the work between two
	// renewals, retries included. Default 30s when Options is nil. In a
	// non-nil Options zero or negative is an error, not the default: the TTL
	// is the one value every caller must choose.
	TTL time.Duration

	// Owner identifies this Manager in lease records and in HeldError. It
	// must be unique among the Managers that compete for the same leases.
	// Goroutines that share a Manager share its owner, so a Manager cannot
	// take a lease it already holds (it gets ErrHeld). Default: a fresh
	// "host/pid/random" string per Manager. A non-empty Owner made of spaces
	// only is an error.
	Owner string

	// Field is the name of the lease subdocument on the leased document (or
	// on the lock document of a named lease). It must not start with "$" or
	// contain ".". Default "_lease".
	Field string

	// RenewEvery is the interval at which Do renews its lease. It must be
	// shorter than TTL minus SafetyMargin. Default TTL/3.
	RenewEvery time.Duration

	// SafetyMargin is subtracted from the holder's local deadline, on top of
	// the clock's error bound, so that the holder stops before anyone else
	// can see the lease as expired even if its timer fires late or its work
	// takes a moment to notice the cancellation. It must be less than TTL.
	// Default TTL/10. Negative is an error.
	SafetyMargin time.Duration

	// DriftRate is the assumed worst-case rate at which the server's clock
	// gains on the local monotonic clock; the holder's deadline gives up
	// TTL×DriftRate for it. Default 1e-4 (100µs per second). Negative, NaN or
	// 0.1 and above are errors.
	DriftRate float64

	// Retry shapes the waits of Acquire between attempts: its
	// InitialInterval, MaxInterval, Multiplier, Jitter and Rand are used;
	// Acquire waits until its context ends, so MaxAttempts and
	// MaxElapsedTime are ignored. Acquire sleeps the next delay or the time
	// left on the holder's lease, whichever is shorter. Default: the retry
	// package's defaults (full jitter, 5ms doubling up to 200ms). An invalid
	// Policy is an error.
	Retry retry.Policy

	// Clock estimates the server's clock (see store.Clock). Default: one
	// Clock per *mongo.Client, shared by every Manager of this package that
	// uses the client with the default Now, and kept (with a reference to
	// the client) for the life of the process; a Manager with its own Now
	// gets its own Clock reading that Now. Programs that make many
	// short-lived clients should pass a Clock of their own.
	Clock *store.Clock

	// Now is the local clock. Only differences between its readings are
	// used (timers and deadlines), never its absolute value, so a host whose
	// wall clock is set wrong behaves correctly. It must advance at the rate
	// of real time. Default time.Now, whose differences use the monotonic
	// clock. Tests inject skewed clocks here.
	Now func() time.Time

	// CleanupAfter applies to named leases: the TTL index that
	// Manager.EnsureIndexes creates deletes a lock document this long after
	// its lease expired or was released. Deleting the document restarts its
	// epoch at 1, so it must exceed the longest time a fencing token of the
	// lease may still be checked. Default 24h. Negative is an error.
	CleanupAfter time.Duration
}

// config is Options with every default resolved.
type config struct {
	ttl          time.Duration
	owner        string
	field        string
	renewEvery   time.Duration
	margin       time.Duration
	drift        float64
	retry        retry.Policy
	clock        *store.Clock
	now          func() time.Time
	cleanupAfter time.Duration
}

func resolve(client *mongo.Client, o *Options) (config, error) {
	var c config
	if o == nil {
		o = &Options{TTL: DefaultTTL}
	}
	if o.TTL <= 0 {
		return c, &OptionsError{Field: "TTL", Reason: fmt.Sprintf("%v is not positive", o.TTL)}
	}
	c.ttl = o.TTL

	c.owner = o.Owner
	if c.owner == "" {
		c.owner = newOwner()
	} else if strings.TrimSpace(c.owner) == "" {
		return c, &OptionsError{Field: "Owner", Reason: fmt.Sprintf("%q is blank", o.Owner)}
	}

	c.field = o.Field
	if c.field == "" {
		c.field = DefaultField
	}
	if err := checkField(c.field); err != "" {
		return c, &OptionsError{Field: "Field", Reason: fmt.Sprintf("%q %s", c.field, err)}
	}

	c.margin = o.SafetyMargin
	switch {
	case c.margin < 0:
		return c, &OptionsError{Field: "SafetyMargin", Reason: fmt.Sprintf("%v is negative", c.margin)}
	case c.margin == 0:
		c.margin = c.ttl / 10
	case c.margin >= c.ttl:
		return c, &OptionsError{Field: "SafetyMargin", Reason: fmt.Sprintf("%v is not less than TTL %v", c.margin, c.ttl)}
	}

	c.renewEvery = o.RenewEvery
	switch {
	case c.renewEvery < 0:
		return c, &OptionsError{Field: "RenewEvery", Reason: fmt.Sprintf("%v is negative", c.renewEvery)}
	case c.renewEvery == 0:
		c.renewEvery = c.ttl / 3
	}
	if c.renewEvery >= c.ttl-c.margin {
		return c, &OptionsError{Field: "RenewEvery", Reason: fmt.Sprintf("%v is not less than TTL %v minus SafetyMargin %v", c.renewEvery, c.ttl, c.margin)}
	}

	c.drift = o.DriftRate
	switch {
	case math.IsNaN(c.drift) || c.drift < 0 || c.drift >= 0.1:
		return c, &OptionsError{Field: "DriftRate", Reason: fmt.Sprintf("%v is not in [0, 0.1)", c.drift)}
	case c.drift == 0:
		c.drift = DefaultDriftRate
	}

	if err := o.Retry.Validate(); err != nil {
		return c, &OptionsError{Field: "Retry", Reason: err.Error()}
	}
	c.retry = o.Retry

	c.cleanupAfter = o.CleanupAfter
	switch {
	case c.cleanupAfter < 0:
		return c, &OptionsError{Field: "CleanupAfter", Reason: fmt.Sprintf("%v is negative", c.cleanupAfter)}
	case c.cleanupAfter == 0:
		c.cleanupAfter = DefaultCleanupAfter
	}

	c.now = o.Now
	c.clock = o.Clock
	switch {
	case c.now == nil && c.clock == nil:
		c.now = time.Now
		c.clock = sharedClock(client)
	case c.now == nil:
		c.now = time.Now
	case c.clock == nil:
		c.clock = store.NewClock(store.HelloSampler(client), &store.ClockOptions{Now: c.now})
	}
	return c, nil
}

// checkField returns why name cannot be a lease field, or "".
func checkField(name string) string {
	switch {
	case strings.HasPrefix(name, "$"):
		return `starts with "$"`
	case strings.Contains(name, "."):
		return `contains "."`
	case strings.ContainsRune(name, 0):
		return "contains a NUL byte"
	case name == "_id":
		return "is the document's _id"
	}
	return ""
}

var clocks sync.Map // *mongo.Client -> *store.Clock

// sharedClock returns the Clock of client, making it on first use.
func sharedClock(client *mongo.Client) *store.Clock {
	if c, ok := clocks.Load(client); ok {
		if clock, ok := c.(*store.Clock); ok {
			return clock
		}
	}
	c, _ := clocks.LoadOrStore(client, store.NewClock(store.HelloSampler(client), nil))
	clock, _ := c.(*store.Clock) // only *store.Clock values are stored
	return clock
}

// newOwner returns "host/pid/random", unique per call.
func newOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

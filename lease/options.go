package lease

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/shard"
	"github.com/mongocas/mongocas/observe"
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
	// store.ServerClockOptions' default).
	DefaultDriftRate = 1e-4
	// DefaultCleanupAfter is how long a named lease's lock document stays
	// after its lease expired or was released before a TTL index may delete
	// it.
	DefaultCleanupAfter = 24 * time.Hour
	// DefaultFenceField is the name of the subdocument that Lease.Stamp
	// writes to documents protected by a named lease.
	DefaultFenceField = "_fence"
)

// Mode says how a Manager judges whether a lease has expired.
type Mode int

const (
	// ModeAuto (the zero value) picks ModeServer where the server runs
	// $expr with $$NOW in a write filter and $$NOW in an update pipeline
	// (MongoDB 4.2 and later, DocumentDB), found by trying them once per
	// client (store.For) on a Manager's first claim, and ModeEstimated
	// elsewhere (FerretDB v1).
	ModeAuto Mode = iota
	// ModeServer judges expiry on the server: a claim's filter compares
	// expiresAt with $$NOW, and claims and renewals set expiresAt from
	// $$NOW. No estimate of the server's clock is used.
	ModeServer
	// ModeEstimated judges expiry on an estimate of the server's clock
	// (store.ServerClock) and writes expiry times computed from it. It needs no
	// $expr or update pipelines.
	ModeEstimated
)

// String returns "auto", "server" or "estimated".
func (m Mode) String() string {
	if names := [...]string{"auto", "server", "estimated"}; m >= 0 && int(m) < len(names) {
		return names[m]
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

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

	// FenceField is the name of the subdocument in which [Lease.Stamp]
	// records, on a document protected by a named lease, the largest epoch
	// of each name stamped there. Same rules as Field. Default "_fence".
	FenceField string

	// Mode says how expiry is judged: ModeAuto (the default) chooses by
	// trying the server once; ModeServer or ModeEstimated force a mode
	// (ModeServer fails on a server without $expr and update pipelines).
	Mode Mode

	// RenewEvery is the interval at which Do (and Lease.KeepAlive) renews
	// its lease. It must be shorter than TTL minus SafetyMargin. Default
	// TTL/3.
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

	// Retry is the retry engine of Acquire's wait and Do's renewals (see
	// retry.Do): its intervals, Jitter, Rand, Budget, OnRetry and Clock are
	// honoured. Acquire, finding the lease held, sleeps until the holder's
	// time is up, at most 5 x MaxInterval at once (see Manager.Acquire);
	// after other failures, the next delay. Acquire stops after MaxAttempts
	// attempts or MaxElapsedTime if they are set; zero means no limit here
	// (unlike retry.Do), so by default Acquire waits until its context ends.
	// With MaxAttempts 1, Acquire and Do make one claim and do not wait in
	// line behind the calls of this process either: a lease held here is
	// then a *HeldError, as one held elsewhere. An invalid Policy is an
	// error.
	Retry retry.Policy

	// ResolveTimeout bounds the work done to settle an ambiguous write (the
	// re-read after a lost reply) and the release after Do, which run on a
	// context that outlives the caller's. Default min(max(TTL, 1s), 10s).
	// Negative is an error.
	ResolveTimeout time.Duration

	// Clock estimates the server's clock in ModeEstimated (see
	// store.ServerClock). Default: the client's shared one
	// (store.For(client).Clock()), or, when Now or Observer is set, a Clock
	// of the Manager's own on store.HelloSampler and Now. Either samples the
	// server only when first used. ModeServer never uses it.
	Clock *store.ServerClock

	// Now is the local clock. Only differences between its readings are
	// used (timers and deadlines), never its absolute value, so a host whose
	// wall clock is set wrong behaves correctly. It must advance at the rate
	// of real time. Default time.Now, whose differences use the monotonic
	// clock. Tests inject skewed clocks here.
	Now func() time.Time

	// CleanupAfter applies to named leases: the TTL index that
	// Manager.EnsureIndexes creates, or Manager.Sweep, deletes a lock
	// document this long after its lease expired or was released. Default
	// 24h. Negative is an error.
	CleanupAfter time.Duration

	// Retain, if not empty, names a date field of the leased document that
	// each renewal of a document lease moves forward, in the renewal's own
	// write (no round trip of its own), to the server's time plus RetainFor,
	// unless the field already holds a later time: in ModeServer $$NOW, in
	// ModeEstimated the Clock's estimate. A document deleted some time after
	// that field has passed (a TTL index on it, or a sweep) is then kept for
	// as long as a lease on it is renewed, and for RetainFor after its last
	// renewal. Claims do not write it: set it with the first write made
	// under the lease. It is a top-level field named by Field's rules, not
	// Field or FenceField. Document leases only: NewNamed refuses it.
	Retain string

	// RetainFor is how far past each renewal Retain is set. Required when
	// Retain is set, and it must then be longer than TTL: the document must
	// outlive the lease on it. Ignored without Retain.
	RetainFor time.Duration

	// ShardKey names the fields of the shard key, as dotted paths, of the
	// collection whose documents the Manager's leases protect, when it is
	// sharded on a key other than _id: for a Manager made by New, the
	// leased collection; for one made by NewNamed, the collection Stamp
	// writes to (the lock collection itself is found by name: shard it on
	// hashed _id). Every command on such a document then filters on an
	// equality with each field, so that mongos routes it to the one shard
	// that owns the document, and the id passed to TryAcquire, Acquire and
	// Do (New) or Stamp (NewNamed) must be a [Key] carrying their values;
	// a bare id is refused. Fields under _id are left out (the _id's
	// equality covers them). A field may not be under Field or FenceField,
	// and no segment may be empty or start with '$'. nil: not sharded, or
	// sharded on _id.
	ShardKey []string

	// Observer, if not nil, receives the Manager's events (see the observe
	// package): the start and end of each TryAcquire, Acquire, Do, Renew
	// and Release (a call refused before anything is sent has none); a
	// lease acquired (with the time waited and the epoch), renewed, not
	// renewed, lost (with the reason), released, or found held by another
	// owner (with its time left); each ambiguous write and how it was
	// settled; the retries of Retry, and of Do's renewals and the re-reads,
	// unless Retry has an Observer of its own; and the syncs of the Clock
	// the Manager makes when Options.Clock is nil. Events of a lease that
	// ends on its own (its deadline passes) come from a timer's goroutine.
	// Nil means none, at no cost: no event is built.
	Observer observe.Observer
}

// config is Options with every default resolved, and ShardKey parsed.
type config struct {
	Options
	shard shard.Spec
}

func resolve(client *mongo.Client, o *Options) (config, error) {
	if o == nil {
		o = &Options{TTL: DefaultTTL}
	}
	c := config{Options: *o}
	if o.TTL <= 0 {
		return c, &OptionsError{Field: "TTL", Reason: fmt.Sprintf("%v is not positive", o.TTL)}
	}
	if c.Owner == "" {
		c.Owner = newOwner()
	} else if strings.TrimSpace(c.Owner) == "" {
		return c, &OptionsError{Field: "Owner", Reason: fmt.Sprintf("%q is blank", o.Owner)}
	}
	c.Field, c.FenceField = cmp.Or(o.Field, DefaultField), cmp.Or(o.FenceField, DefaultFenceField)
	for _, f := range []struct{ name, v string }{{"Field", c.Field}, {"FenceField", c.FenceField}, {"Retain", o.Retain}} {
		if why := checkField(f.v); why != "" && f.v != "" {
			return c, &OptionsError{Field: f.name, Reason: fmt.Sprintf("%q %s", f.v, why)}
		}
	}
	switch {
	case c.FenceField == c.Field:
		return c, &OptionsError{Field: "FenceField", Reason: fmt.Sprintf("%q is also Field", c.FenceField)}
	case c.Retain != "" && (c.Retain == c.Field || c.Retain == c.FenceField):
		return c, &OptionsError{Field: "Retain", Reason: fmt.Sprintf("%q is also Field or FenceField", o.Retain)}
	case c.Retain != "" && o.RetainFor <= o.TTL:
		return c, &OptionsError{Field: "RetainFor", Reason: fmt.Sprintf("%v is not longer than TTL %v: the document must outlive the lease on it", o.RetainFor, o.TTL)}
	case o.Mode != ModeAuto && o.Mode != ModeServer && o.Mode != ModeEstimated:
		return c, &OptionsError{Field: "Mode", Reason: fmt.Sprintf("%v is not a mode", o.Mode)}
	case math.IsNaN(c.DriftRate) || c.DriftRate < 0 || c.DriftRate >= 0.1:
		return c, &OptionsError{Field: "DriftRate", Reason: fmt.Sprintf("%v is not in [0, 0.1)", c.DriftRate)}
	}
	var err error
	if c.shard, err = parseShardKey(o.ShardKey, &c); err != nil {
		return c, err
	}
	if c.SafetyMargin, err = orDefault("SafetyMargin", o.SafetyMargin, c.TTL/10); err != nil {
		return c, err
	}
	if c.SafetyMargin >= c.TTL {
		return c, &OptionsError{Field: "SafetyMargin", Reason: fmt.Sprintf("%v is not less than TTL %v", c.SafetyMargin, c.TTL)}
	}
	if c.RenewEvery, err = orDefault("RenewEvery", o.RenewEvery, c.TTL/3); err != nil {
		return c, err
	}
	if c.RenewEvery >= c.TTL-c.SafetyMargin {
		return c, &OptionsError{Field: "RenewEvery", Reason: fmt.Sprintf("%v is not less than TTL %v minus SafetyMargin %v", c.RenewEvery, c.TTL, c.SafetyMargin)}
	}
	if err := o.Retry.Validate(); err != nil {
		return c, &OptionsError{Field: "Retry", Reason: err.Error()}
	}
	if c.Retry.Observer == nil {
		c.Retry.Observer = o.Observer
	}
	if c.ResolveTimeout, err = orDefault("ResolveTimeout", o.ResolveTimeout, min(max(c.TTL, time.Second), 10*time.Second)); err != nil {
		return c, err
	}
	if c.CleanupAfter, err = orDefault("CleanupAfter", o.CleanupAfter, DefaultCleanupAfter); err != nil {
		return c, err
	}
	c.DriftRate = cmp.Or(c.DriftRate, DefaultDriftRate)
	if c.Now == nil {
		c.Now = time.Now
	}
	// Lazy: neither does I/O, and a Manager in ModeServer never asks the
	// clock for the time.
	switch {
	case c.Clock != nil:
	case o.Now == nil && o.Observer == nil:
		c.Clock = store.For(client).Clock()
	default:
		c.Clock = store.NewServerClock(store.HelloSampler(client), &store.ServerClockOptions{Now: c.Now, Observer: o.Observer})
	}
	return c, nil
}

// orDefault returns v, or def when v is zero; a negative v is an error.
func orDefault(field string, v, def time.Duration) (time.Duration, error) {
	if v < 0 {
		return 0, &OptionsError{Field: field, Reason: fmt.Sprintf("%v is negative", v)}
	}
	return cmp.Or(v, def), nil
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

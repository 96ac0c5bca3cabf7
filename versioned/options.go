package versioned

import (
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
)

// Defaults of the Options fields.
const (
	// DefaultVersionField is the default BSON name of the version field.
	DefaultVersionField = "version"
	// DefaultMetaField is the default BSON name of the subdocument in which
	// writes record their write ids.
	DefaultMetaField = "_mc"
	// DefaultReserved is the top-level field reserved by default: the lease
	// package's lease record.
	DefaultReserved = "_lease"
	// DefaultResolveTimeout is the default bound on re-reading, after the
	// caller's context ended, to learn whether an ambiguous write landed.
	DefaultResolveTimeout = 5 * time.Second
)

// WriteIDs is the write-id protocol's constant H: a document keeps the ids
// (random 64-bit integers) of its last WriteIDs writes, and no more. Each
// write appends its id and cuts the list to its last WriteIDs entries in the
// same statement, on the server, so the bound holds whoever writes: the
// version and Options.MetaField take at most about 240 bytes. A repository
// can settle a write whose reply was lost as long as fewer than WriteIDs
// write ids (one per change: a write combining k Modify calls appends k)
// landed after it. See DESIGN.md.
const WriteIDs = 16

// Options configures a Repo. A nil *Options means all defaults; each zero
// field takes its default.
type Options struct {
	// VersionField is the BSON name of the version field. T must map it to
	// an int64 field. Default "version".
	VersionField string

	// MetaField is the BSON name of the subdocument where the repository
	// keeps the document's incarnation id and the ids of its last
	// [WriteIDs] writes. T must not map it. Default "_mc".
	MetaField string

	// Reserved names top-level fields that belong to another component, such
	// as the lease package's lease record: Guarded refuses an update path in
	// them, Modify refuses a fn that changes them, and Update never writes
	// them (all with an error matching [ErrInvalid], before anything is
	// sent). T may map them to read them. nil means {"_lease"}; an empty
	// non-nil slice reserves nothing.
	Reserved []string

	// Retry is the policy for Modify's conflict retries and for re-reads
	// after an ambiguous write. Its zero fields take the retry package's
	// defaults (full jitter from 5ms to 200ms), except three: MaxAttempts
	// 0 means no bound on attempts, MaxElapsedTime 0 means
	// [DefaultRetryTime] (10s), and a nil Budget means a budget the Repo
	// makes for itself ([DefaultRetryBudget] retries a second). The time
	// and the budget, not an attempt count, protect the server from a
	// storm of conflicts. Set MaxAttempts for a bound on attempts; share
	// one retry.Budget between Repos to cap retries across the process.
	Retry retry.Policy

	// ResolveTimeout bounds how long the repository keeps re-reading to
	// learn whether an ambiguous write landed once the caller's context has
	// ended (for example when the write itself timed out on that context's
	// deadline). Default 5s. Negative is invalid.
	ResolveTimeout time.Duration

	// ShardKey names the fields of the collection's shard key, as dotted
	// paths in T's documents ("region", "owner.accountId"), when the
	// collection is sharded on a key other than _id. Every command the
	// repository sends then filters on an equality with each of them, so
	// that mongos routes it to the one shard that owns the document (see the
	// package documentation, "Sharded collections"); the values come from
	// the document (Insert, Update, Delete) or from the [Key] passed as the
	// id (Get, Modify, Guarded, which refuse a bare id). Hashed or ranged
	// makes no difference; list every field of a compound key. Fields under
	// _id are left out (the _id's equality covers them), so {"_id"} is the
	// same as nil. A field must be under a top-level field T maps and not
	// the version field, MetaField or a reserved field; no segment may be
	// empty or start with '$'. Each _id must be unique across the
	// collection, as MongoDB requires of applications whose shard key is not
	// _id. New does not read the shard key from the cluster's metadata: name
	// it here. nil: the collection is not sharded, or is sharded on _id.
	ShardKey []string

	// Observer, if not nil, receives the repository's events: the start and
	// end of each call (Get, Insert, Update, Delete, Modify, Guarded; a call
	// refused before anything is sent has none), its version conflicts, its
	// retries, and each ambiguous write and how it was settled (see the
	// observe package). It also gets the retry events of Retry, and of a
	// WithRetry policy, that has no Observer of its own. Nil means none, at
	// no cost: no event is built.
	Observer observe.Observer
}

func (o *Options) resolve() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.VersionField == "" {
		r.VersionField = DefaultVersionField
	}
	if r.MetaField == "" {
		r.MetaField = DefaultMetaField
	}
	if r.Reserved == nil {
		r.Reserved = []string{DefaultReserved}
	}
	if r.ResolveTimeout == 0 {
		r.ResolveTimeout = DefaultResolveTimeout
	}
	bad := func(field, reason string, err error) (Options, error) {
		return r, &InvalidError{Op: "new", Field: "Options." + field, Reason: reason, Err: err}
	}
	for _, f := range []struct{ field, name string }{{"VersionField", r.VersionField}, {"MetaField", r.MetaField}} {
		if err := checkKey(f.name); err != nil {
			return bad(f.field, err.Error(), nil)
		}
		if f.name == "_id" {
			return bad(f.field, `"_id" is the id`, nil)
		}
	}
	switch {
	case r.VersionField == r.MetaField:
		return bad("MetaField", fmt.Sprintf("%q is also the version field", r.MetaField), nil)
	case r.ResolveTimeout < 0:
		return bad("ResolveTimeout", fmt.Sprintf("%v is negative", r.ResolveTimeout), nil)
	}
	for _, name := range r.Reserved {
		if err := checkKey(name); err != nil || name == "" {
			return bad("Reserved", fmt.Sprintf("%q is not a top-level field name", name), err)
		}
		if name == "_id" || name == r.VersionField || name == r.MetaField {
			return bad("Reserved", fmt.Sprintf("%q is the repository's own field", name), nil)
		}
	}
	if err := r.Retry.Validate(); err != nil {
		return bad("Retry", "invalid policy", err)
	}
	if r.Retry.Observer == nil {
		r.Retry.Observer = r.Observer
	}
	return r, nil
}

// WriteOption adjusts one Update, Delete, Modify or Guarded call.
type WriteOption func(*writeConfig)

// guard is one condition of a write: a Where filter, or Guarded's cond.
type guard struct {
	filter  any // bson.D, or bson.Raw for cond
	failErr error
}

// writeConfig is one call's options. Each field is declared in
// writeFields, with what a Modify call that sets it may share.
type writeConfig struct {
	guards []guard
	sets   bson.D // WithSet's fields, checked by Repo.config
	policy *retry.Policy
}

// writeFields decides, for each field of writeConfig, whether a Modify call
// that sets it may share a combined write with other calls (that write
// carries the leader's options only), and whether Modify's pipeline form
// (a findOneAndUpdate filtered on the id alone, with the version and
// incarnation as its condition) can carry it. A field added to writeConfig
// without a decision here fails TestEveryWriteOptionDecidesCombining.
var writeFields = []writeField{
	// Filters of the call's own: the others' changes must not be held to
	// them, and the pipeline's condition does not include them.
	{"guards", func(c *writeConfig) bool { return len(c.guards) > 0 }, false, false},
	// Fields set with the call's change only.
	{"sets", func(c *writeConfig) bool { return len(c.sets) > 0 }, false, false},
	// The call's own retry policy: the leader's would run the write.
	{"policy", func(c *writeConfig) bool { return c.policy != nil }, false, true},
}

// writeField is the decision on one field of writeConfig.
type writeField struct {
	name     string
	set      func(*writeConfig) bool // the call sets it
	combines bool                    // calls that set it may share a write
	pipeline bool                    // the pipeline form carries it
}

// alone reports whether a Modify call with these options takes its turn
// alone, its write combining no other call's (writeFields).
func (c *writeConfig) alone() bool {
	for _, f := range writeFields {
		if !f.combines && f.set(c) {
			return true
		}
	}
	return false
}

// piped reports whether Modify's pipeline form can carry these options
// (writeFields).
func (c *writeConfig) piped() bool {
	for _, f := range writeFields {
		if !f.pipeline && f.set(c) {
			return false
		}
	}
	return true
}

// Where adds conditions to a write's filter, ANDed with the id, the version
// and any other condition. If the document exists (at the expected version,
// for writes that expect one) but does not match, the write changes nothing
// and returns a [*GuardError], which matches [ErrGuardFailed]. [Repo.Modify]
// checks the conditions when it reads, too, so fn is not called on a
// document that fails them. A typical use is a state the write requires:
//
//	repo.Update(ctx, order, versioned.Where(bson.D{{"status", "open"}}))
//
// To fence a write on a lease of the lease package, pass its Fence (the
// lease record's owner and epoch, "_lease.owner" and "_lease.epoch" by
// default) with WhereErr, so that a lost lease reports lease.ErrLost:
//
//	repo.Update(ctx, doc, versioned.WhereErr(l.Fence(), lease.ErrLost))
func Where(filter bson.D) WriteOption {
	return WhereErr(filter, nil)
}

// WhereErr is [Where] whose failure also matches failErr: the returned
// [*GuardError] unwraps to failErr, so errors.Is(err, failErr) holds and
// errors.As reaches failErr's type. When a write has several conditions,
// the repository re-checks each WhereErr filter after the failure to tell
// which one failed; the first one found failing gives its error.
func WhereErr(filter bson.D, failErr error) WriteOption {
	return func(c *writeConfig) {
		if len(filter) > 0 {
			c.guards = append(c.guards, guard{filter: filter, failErr: failErr})
		}
	}
}

// WithSet sets fields the model does not own (a stamp, say) in the same
// statement as an Update, Modify or Guarded write: only if the write
// applies, and only if it writes (a Modify whose fn changes nothing writes
// nothing). Its paths must not overlap a top-level field T maps, the
// repository's own fields (id, version, MetaField, Options.Reserved, shard
// key), each other or, in Guarded, the update's paths: an [*InvalidError],
// nothing sent. Delete refuses it. A Modify call with WithSet is not
// combined with others (see [Repo.Modify]): its fields go with its change.
func WithSet(fields ...bson.E) WriteOption {
	return func(c *writeConfig) { c.sets = append(c.sets, fields...) }
}

// config applies a call's options and checks its WithSet fields as
// Guarded's checks a $set, and against T's fields.
func (r *Repo[T]) config(op string, opts []WriteOption) (writeConfig, error) {
	var c writeConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if len(c.sets) == 0 {
		return c, nil
	}
	if op == "delete" {
		return c, &InvalidError{Op: op, Field: "WithSet", Reason: "Delete writes no field"}
	}
	raw, err := encodeUpdate(op, bson.D{{Key: "$set", Value: c.sets}})
	if err != nil {
		return c, err
	}
	if err := r.checkOps(op, raw); err != nil {
		return c, err
	}
	c.sets = opsOf(raw)[0].Value.(bson.D) //nolint:forcetypeassert // opsOf's form
	for _, e := range c.sets {
		if root, _, _ := strings.Cut(e.Key, "."); r.s.mapped[root] != nil {
			return c, &InvalidError{Op: op, Field: e.Key, Reason: fmt.Sprintf("WithSet: %s maps %q: the model's fields are the write's own", r.s.typ, root)}
		}
	}
	return c, nil
}

// WithRetry replaces the repository's retry policy (Options.Retry) for one
// call: Modify's conflict retries, and the re-reads after an ambiguous write
// of any call. Its zero fields take the defaults Options.Retry's do (a nil
// Budget is the repository's budget). A Modify call with WithRetry is not
// combined with others (see [Repo.Modify]).
func WithRetry(p retry.Policy) WriteOption {
	return func(c *writeConfig) { c.policy = &p }
}

package versioned

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/internal/shard"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// Repo stores documents of type T in one collection with optimistic
// concurrency control. Make it with New. A Repo is safe for concurrent use;
// make one per collection and share it, so that it can reuse what it learns
// about documents: the last write id it saw of each (up to 4096 documents)
// lets [Repo.Guarded] skip its read, and lets [Repo.Delete] settle a lost
// reply exactly. Safety never depends on it (DESIGN.md beside this file,
// "What every document carries").
type Repo[T any] struct {
	coll             *mongo.Collection
	majority         *settle.Majority // the settling re-reads of coll
	s                *schema
	opts             Options
	cache            *docCache
	shard            shard.Spec // Options.ShardKey, checked
	lines            *collLines // where Modify calls on one document wait in line
	idsPath, incPath string     // of the write ids and incarnation in MetaField
	server           *store.Server
}

// New returns a repository of T over coll, the caller's collection (New
// does not own the client). T must be a struct type with a field mapped to
// "_id" and an int64 field mapped to the version field (Options.VersionField,
// default "version"), named the way the driver's default struct codec names
// them: the bson tag, or else the lowercased Go name. New reflects over T
// once; a T it cannot work with (no id, no int64 version, an inline map, a
// field name with '$' or '.', a custom BSON marshaler), a nil coll, or a bad
// Options field is an *InvalidError.
func New[T any](coll *mongo.Collection, opts *Options) (*Repo[T], error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if coll == nil {
		return nil, &InvalidError{Op: "new", Reason: "collection is nil"}
	}
	s, err := describe(reflect.TypeFor[T](), o.VersionField, o.MetaField)
	if err != nil {
		return nil, err
	}
	spec, err := o.parseShardKey()
	if err != nil {
		return nil, err
	}
	if err := s.checkShardKey(spec); err != nil {
		return nil, err
	}
	o.Retry = withDefaults(o.Retry, retry.NewBudget(DefaultRetryBudget, 2*DefaultRetryBudget))
	return &Repo[T]{
		coll: coll, majority: settle.NewMajority(coll), s: s, opts: o, cache: newDocCache(),
		shard: spec, lines: linesOf(coll), server: store.For(coll.Database().Client()),
		idsPath: metaPath(o.MetaField, metaIDs), incPath: metaPath(o.MetaField, metaInc),
	}, nil
}

// Collection returns the collection the repository works on.
func (r *Repo[T]) Collection() *mongo.Collection { return r.coll }

// Get reads the document with the given id. Its version field holds the
// stored version (0 for a document written before the repository was
// adopted). It fails with a *NotFoundError if there is none, and a
// *VersionTypeError if its stored version is not an integer from 0 to
// math.MaxInt64-1.
func (r *Repo[T]) Get(ctx context.Context, id any) (_ *T, err error) {
	const op = "get"
	idv, key, err := r.start(ctx, op, id)
	if err != nil {
		return nil, err
	}
	ctx, ob := r.begin(ctx, op, idv)
	defer r.end(&ob, &err)
	st, err := r.find(ctx, r.coll, op, idv, key, nil)
	if err != nil {
		return nil, err
	}
	return r.decode(op, idv, st)
}

// Insert stores doc as a new document at a random starting version, below
// 2^52, and sets doc's version field to it (versions are opaque: see the
// package documentation). Its id must be set (Insert does not generate one).
// An id that exists already is a *DuplicateError, as is a value another
// unique index holds. The random start, and the incarnation id Insert
// stamps, make sure that a document deleted and inserted again is never
// taken for the old one, by any repository. If the reply is lost, Insert
// re-reads to learn whether its document landed; it never sends the insert
// again (a second copy could bring back a document deleted meanwhile), so
// when the document is not there it returns an *UnknownOutcomeError.
func (r *Repo[T]) Insert(ctx context.Context, doc *T) (err error) {
	const op = "insert"
	v, id, key, err := r.docID(ctx, op, doc)
	if err != nil {
		return err
	}
	ctx, ob := r.begin(ctx, op, id)
	defer r.end(&ob, &err)
	wid, start := newWriteID(), startVersion()
	// Encoded at the start version, with the write ids appended: the
	// caller's doc gets its version only once the insert landed.
	was := r.s.versionOf(v)
	r.s.setVersion(v, start)
	raw, err := r.encode(op, doc)
	r.s.setVersion(v, was)
	if err != nil {
		return err
	}
	ins := withMeta(raw, r.opts.MetaField, wid)
	var dupErr error
	w := &write{op: op, id: id, key: key, wid: wid, base: 0}
	w.send = func(ctx context.Context) (sent, error) {
		_, err := r.coll.InsertOne(ctx, ins)
		if store.IsDuplicateKey(err) {
			dupErr = err
			return sent{}, nil
		}
		return sent{matched: err == nil}, err
	}
	w.judge = func(st *docState) (settle.Verdict, string) {
		switch {
		case st == nil:
			return settle.Unknown, "no document has the id: the insert may have landed and been deleted since, or never arrived, and sending it again could bring back a deleted document"
		case st.inc == wid || st.has(wid):
			return settle.Landed, ""
		}
		return settle.Unknown, "another incarnation of the document is stored: the insert may have been refused as a duplicate, or have landed and been deleted since"
	}
	out, err := r.exec(ctx, &r.opts.Retry, w)
	if err != nil {
		return err
	}
	if !out.Applied {
		return &DuplicateError{Op: op, ID: id, Err: dupErr}
	}
	r.s.setVersion(v, start)
	if out.Read == nil {
		r.cache.put(cacheKey(key), seen{version: start, last: wid, meta: meta{inc: wid, ids: exactIDs(nil, wid).Value}})
	}
	return nil
}

// Update writes the caller's copy doc over the stored document, provided the
// stored version is still doc's version: one updateOne filtered on the id,
// that version and any Where filters, that $sets the fields T maps, $unsets
// the mapped fields doc omits, and raises the version by one. Fields T does
// not map, and reserved fields (Options.Reserved), are left as they are. On
// success doc's version field holds the new version. doc's version also
// names the incarnation of the document it was read from (Insert starts
// each at a random version), so a copy of a document deleted and inserted
// again since matches nothing, whichever repository sends it. A version
// that is negative, or the largest one (math.MaxInt64-1, after which the
// version would overflow), is an *InvalidError.
//
// With Options.ShardKey, Update never writes a top-level shard-key field,
// and a doc whose shard-key values differ from those the repository last
// read for its id is an *InvalidError (a shard key cannot be changed here).
//
// When nothing matched, one re-read tells why: a *GuardError if a Where
// filter fails (whatever the version), else a *ConflictError (with the
// current version) if the version moved, a *NotFoundError if the document is
// gone. doc is then left unchanged.
func (r *Repo[T]) Update(ctx context.Context, doc *T, opts ...WriteOption) (err error) {
	const op = "update"
	v, id, key, err := r.docID(ctx, op, doc)
	if err != nil {
		return err
	}
	cfg, err := r.config(op, opts)
	if err != nil {
		return err
	}
	ctx, ob := r.begin(ctx, op, id)
	defer r.end(&ob, &err)
	raw, err := r.encode(op, doc)
	if err != nil {
		return err
	}
	set, unset, err := r.fullDiff(raw)
	if err != nil {
		return &InvalidError{Op: op, Reason: "malformed BSON", Err: err}
	}
	ver := r.s.versionOf(v)
	if err := checkBase(op, r.opts.VersionField, ver, true); err != nil {
		return err
	}
	if err := r.shardMoved(op, id, key); err != nil {
		return err
	}
	out, err := r.updateCAS(ctx, op, id, key, ver, set, unset, &cfg)
	if err != nil {
		return err
	}
	if !out.Applied {
		return r.conflicted(ctx, r.whyNotApplied(ctx, op, id, key, ver, out, cfg.guards))
	}
	r.s.setVersion(v, ver+1)
	return nil
}

// updateCAS sends Update's updateOne against version base: the field
// changes, the version set to base+1 and the write id pushed, filtered on
// the id, base and the guards; see exec. When the metadata at base is
// cached, the filter pins it (metaIs) and the last id too, and the list is
// $set exactly (recordIDs; DESIGN.md, "What every document carries").
func (r *Repo[T]) updateCAS(ctx context.Context, op string, id any, key docKey, base int64, set, unset bson.D, cfg *writeConfig) (outcome, error) {
	ck := cacheKey(key)
	s, cached := r.cache.lookup(ck)
	cached = cached && s.version == base
	out, err := r.updateFrom(ctx, op, id, key, base, set, unset, cfg, s, cached)
	if err != nil && (!cached || !s.exact()) {
		// The $push of a write that had not read the metadata: refused
		// (nothing written) if the metadata is unfit. Then once more, from
		// the metadata read.
		var we mongo.WriteException
		if errors.As(err, &we) && len(we.WriteErrors) > 0 && !store.IsDuplicateKey(err) {
			st, rerr := r.reread(ctx, r.coll, op, id, key)
			if rerr == nil && st != nil && st.version == base && st.unfit.Type != 0 {
				return r.updateFrom(ctx, op, id, key, base, set, unset, cfg, st.seen(), true)
			}
		}
	}
	return out, err
}

// updateFrom is updateCAS from s, what was seen of the document, if cached
// (at base).
func (r *Repo[T]) updateFrom(ctx context.Context, op string, id any, key docKey, base int64, set, unset bson.D, cfg *writeConfig, s seen, cached bool) (outcome, error) {
	w := &write{op: op, id: id, key: key, wid: newWriteID(), base: base}
	ck := cacheKey(key)
	known := cached && s.exact()
	filter := append(key.Filter(), r.versionIs(base))
	set = append(slices.Clip(set), cfg.sets...)
	set = append(set, bson.E{Key: r.opts.VersionField, Value: base + 1})
	update := make(bson.D, 1, 3)
	var ids bson.RawValue
	if known {
		filter = append(filter, r.metaIs(s.meta))
		if s.last != 0 {
			filter = append(filter, bson.E{Key: r.idsPath, Value: s.last})
		}
		var rec bson.E
		rec, ids = r.recordIDs(s.meta, w.wid)
		set = append(set, rec)
	} else {
		update = append(update, bson.E{Key: "$push", Value: pushID(r.idsPath, w.wid)})
	}
	filter = withGuards(filter, cfg.guards)
	update[0] = bson.E{Key: "$set", Value: set}
	if len(unset) > 0 {
		update = append(update, bson.E{Key: "$unset", Value: unset})
	}
	w.send = func(ctx context.Context) (sent, error) { return r.updateOne(ctx, filter, update) }
	w.judge = judgeSpan(w, s.inc, known, 1)
	out, err := r.exec(ctx, r.policy(cfg), w)
	if err != nil {
		return out, r.dupOr(op, id, err)
	}
	if out.Applied {
		// Of which incarnation version base+1 is, when known (re-read, or
		// cached at base); else the cache is left as it is.
		switch {
		case out.Read != nil:
			r.cache.put(ck, seen{version: base + 1, last: w.wid, meta: meta{inc: out.Read.inc}})
		case known:
			r.cache.put(ck, seen{version: base + 1, last: w.wid, meta: meta{inc: s.inc, ids: ids.Value}})
		case cached:
			r.cache.put(ck, seen{version: base + 1, last: w.wid, meta: meta{inc: s.inc}})
		}
	}
	return out, nil
}

// whyNotApplied tells why a write made against version expected did not
// apply, re-reading the document unless exec already did. The caller
// reports a conflict to the Observer (a combined Modify write, to each of
// its calls).
func (r *Repo[T]) whyNotApplied(ctx context.Context, op string, id any, key docKey, expected int64, out outcome, guards []guard) error {
	st := out.Read
	if !out.HasRead {
		var err error
		if st, err = r.reread(ctx, r.coll, op, id, key); err != nil {
			return err
		}
	}
	return r.classify(ctx, op, id, key, expected, st, guards)
}

// Delete removes the stored document, provided its version is still doc's
// version and it matches any Where filters: one deleteOne filtered on the
// id, the version (which names the incarnation, as for Update) and the
// filters. When nothing matched, one re-read tells a *GuardError, a
// *ConflictError and a *NotFoundError apart, as for Update. If the reply is
// lost and the document is gone when re-read, Delete reports success: the
// document it was to delete no longer exists, although another writer may
// have removed it. If it is at another version that the re-read cannot
// relate to doc's (far ahead, or another incarnation), the outcome is an
// *UnknownOutcomeError.
func (r *Repo[T]) Delete(ctx context.Context, doc *T, opts ...WriteOption) (err error) {
	const op = "delete"
	v, id, key, err := r.docID(ctx, op, doc)
	if err != nil {
		return err
	}
	cfg, err := r.config(op, opts)
	if err != nil {
		return err
	}
	ctx, ob := r.begin(ctx, op, id)
	defer r.end(&ob, &err)
	ver := r.s.versionOf(v)
	if err := checkBase(op, r.opts.VersionField, ver, false); err != nil {
		return err
	}
	// The incarnation seen at this version, if any, is pinned too, so that
	// a lost reply is judged exactly.
	ck := cacheKey(key)
	s, known := r.cache.lookup(ck)
	known = known && s.version == ver
	filter := append(key.Filter(), r.versionIs(ver))
	if known {
		filter = append(filter, r.metaIs(s.meta))
	}
	filter = withGuards(filter, cfg.guards)
	w := &write{op: op, id: id, key: key, base: ver}
	w.send = func(ctx context.Context) (sent, error) {
		res, err := r.coll.DeleteOne(ctx, filter)
		if err != nil {
			return sent{}, err
		}
		return sent{matched: res.DeletedCount == 1}, nil
	}
	w.judge = func(st *docState) (settle.Verdict, string) {
		switch {
		case st == nil, known && st.inc != s.inc:
			return settle.Landed, "" // the incarnation it targeted is gone
		case st.version == ver:
			return settle.Live, ""
		case st.version > ver && (known || st.version-ver <= countIDs(st.ids)):
			// The same incarnation moved on: a delete would have removed it.
			return settle.Dead, ""
		}
		// Another incarnation, the same far ahead, or a majority-committed
		// state that has not caught up with the version the caller read.
		return settle.Unknown, whyUnrelated
	}
	out, err := r.exec(ctx, r.policy(&cfg), w)
	if err != nil {
		return err
	}
	if out.Applied {
		r.cache.forget(ck)
		return nil
	}
	return r.conflicted(ctx, r.whyNotApplied(ctx, op, id, key, ver, out, cfg.guards))
}

// start checks ctx and id (a Key, or a bare id) for an operation that
// takes an id.
func (r *Repo[T]) start(ctx context.Context, op string, id any) (any, docKey, error) {
	if err := checkCtx(ctx, op); err != nil {
		return nil, docKey{}, err
	}
	bare, vals, err := r.shard.Split(id)
	if err != nil {
		return nil, docKey{}, &InvalidError{Op: op, Field: "_id", Err: err}
	}
	idv, key, err := r.s.checkID(op, bare)
	return idv, docKey{ID: key, Shard: vals}, err
}

// docID checks ctx and doc, and returns doc as a settable value, with its
// id and its shard-key values.
func (r *Repo[T]) docID(ctx context.Context, op string, doc *T) (reflect.Value, any, docKey, error) {
	if err := checkCtx(ctx, op); err != nil {
		return reflect.Value{}, nil, docKey{}, err
	}
	if doc == nil {
		return reflect.Value{}, nil, docKey{}, &InvalidError{Op: op, Reason: "document is nil"}
	}
	v := valueOf(doc)
	idv, key, err := r.s.checkID(op, r.s.idOf(v).Interface())
	if err != nil {
		return reflect.Value{}, nil, docKey{}, err
	}
	vals, err := r.docShard(op, idv, doc)
	if err != nil {
		return reflect.Value{}, nil, docKey{}, err
	}
	return v, idv, docKey{ID: key, Shard: vals}, nil
}

// valueOf returns the struct doc points to.
func valueOf[T any](doc *T) reflect.Value { return reflect.ValueOf(doc).Elem() }

// policy is the retry policy of one call.
func (r *Repo[T]) policy(cfg *writeConfig) *retry.Policy {
	if cfg == nil || cfg.policy == nil {
		return &r.opts.Retry
	}
	p := withDefaults(*cfg.policy, r.opts.Retry.Budget)
	if p.Observer == nil {
		p.Observer = r.opts.Observer
	}
	return &p
}

// dupOr turns a duplicate key error, as exec returns it, into a
// *DuplicateError holding the driver's error.
func (r *Repo[T]) dupOr(op string, id any, err error) error {
	if !store.IsDuplicateKey(err) {
		return err
	}
	if inner := errors.Unwrap(err); inner != nil && store.IsDuplicateKey(inner) {
		err = inner // drop exec's prefix, which DuplicateError repeats
	}
	return &DuplicateError{Op: op, ID: id, Err: err}
}

// checkCtx refuses a nil context (an *InvalidError) and returns the
// context's own error, wrapped, for one that has already ended, before
// anything is sent.
func checkCtx(ctx context.Context, op string) error {
	if ctx == nil {
		return &InvalidError{Op: op, Reason: "context is nil"}
	}
	if err := store.ContextError(ctx); err != nil {
		return fmt.Errorf("versioned: %s: %w", op, err)
	}
	return nil
}

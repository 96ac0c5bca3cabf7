package versioned

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/store"
)

// Guarded applies the caller's update operators to the document with the
// given id if it matches cond, in one statement: one findOneAndUpdate whose
// filter is the id, cond and any Where filters, and whose update is the
// caller's operators (with any WithSet fields in its $set) plus $inc of the
// version by one (and the write id). The server evaluates cond and applies
// the update atomically, so no version needs to be read first and no
// conflict can occur: this is the call for hot counters such as stock or
// balances.
//
//	item, err := repo.Guarded(ctx, sku,
//		bson.D{{"stock", bson.D{{"$gte", qty}}}},
//		bson.D{{"$inc", bson.D{{"stock", -qty}}}})
//
// cond is a query filter (a bson.D, bson.M or anything that marshals to a
// BSON document); nil means no condition. update may use $set, $unset, $inc
// and $currentDate only (the operators every target server runs), on any
// path except the id, the version field, Options.MetaField, the reserved
// fields (Options.Reserved) and shard-key fields (Options.ShardKey); two
// paths may not overlap, and the values $set may not exceed MongoDB's 16 MiB
// document limit. A bad update is an *InvalidError and nothing is sent. So
// is a write to a document at the largest version (math.MaxInt64-1): the
// filter requires a version below it, so that the $inc cannot wrap.
//
// Guarded returns the document as stored after the write. If cond (or a
// Where filter) does not match it returns a *GuardError, and a
// *NotFoundError if there is no such document: one re-read tells them apart.
//
// Guarded normally makes one round trip. Its filter requires an "anchor":
// the id of a write the document carried when the repository last saw it (or
// read it first, if it has not seen it), which makes sure that a copy of the
// write sent again cannot apply twice. If more than WriteIDs writes have
// landed since, the anchor is gone: Guarded reads and sends again, for as
// long as the retry policy's MaxElapsedTime allows (Options.Retry or
// WithRetry; default [DefaultRetryTime]), then returns a *ConflictError. So
// that a busy document does not push anchors out, at most WriteIDs/4 Guarded
// calls per document and *mongo.Client are in flight; the others wait their
// turn (one whose ctx ends meanwhile returns its error, having sent
// nothing). If the reply is lost and the write turns out to have landed, the
// document returned is the one re-read, which may include later writes.
func (r *Repo[T]) Guarded(ctx context.Context, id any, cond, update any, opts ...WriteOption) (_ *T, err error) {
	const op = "guarded"
	idv, key, err := r.start(ctx, op, id)
	if err != nil {
		return nil, err
	}
	ctx, ob := r.begin(ctx, op, idv)
	defer r.end(&ob, &err)
	cfg, err := r.config(op, opts)
	if err != nil {
		return nil, err
	}
	ops, err := r.updateOps(op, update, cfg.sets)
	if err != nil {
		return nil, err
	}
	guards := cfg.guards
	if cond != nil {
		c, err := bson.Marshal(cond)
		if err != nil {
			return nil, &InvalidError{Op: op, Field: "cond", Reason: "cond cannot be encoded as a document", Err: err}
		}
		if len(c) > 5 { // not the empty document
			guards = append([]guard{{filter: bson.Raw(c)}}, guards...)
		}
	}
	ck := cacheKey(key)
	g, err := r.lines.enter(ctx, ck)
	if err != nil {
		return nil, wrapErr(op, idv, store.ContextError(ctx))
	}
	defer r.lines.exit(ck, g, true)
	budget, begun := r.policy(&cfg).MaxElapsedTime, time.Now()
	if budget == 0 {
		budget = DefaultRetryTime
	}
	var fresh *seen // what the last round's re-read showed
	for round := 0; ; round++ {
		s, ok := r.cache.lookup(ck)
		if fresh != nil {
			// Not the cache, which keeps a newer state of the same
			// incarnation: one a rolled-back transaction left there.
			s, ok = *fresh, true
		}
		if !ok {
			st, err := r.find(ctx, r.coll, op, idv, key, nil)
			if err != nil {
				return nil, err
			}
			s = st.seen()
		}
		w := &write{op: op, id: idv, key: key, wid: newWriteID(), base: s.version}
		filter := key.Filter()
		// No write id yet, or a full list where $slice is ignored: pin the
		// version and incarnation, and $set the list exactly.
		pinned := s.last == 0 || (round < 2 && countIDs(s.ids) >= WriteIDs && r.ignoresSlice(ctx))
		var rec bson.E // none: $push
		if pinned {
			if err := checkBase(op, r.opts.VersionField, s.version, true); err != nil {
				return nil, err
			}
			filter = append(filter, r.versionIs(s.version), r.metaIs(s.meta))
			if s.last != 0 { // the list at that version is the one seen (see updateCAS)
				filter = append(filter, bson.E{Key: r.idsPath, Value: anchorClause(s.last, w.wid)})
			}
			rec, _ = r.recordIDs(s.meta, w.wid)
			w.judge = judgeSpan(w, s.inc, true, 1)
		} else {
			// A version below the last, so that $inc cannot wrap it; the
			// anchor, so that a copy sent again cannot apply twice.
			filter = append(filter, r.versionBelowLast(), bson.E{Key: r.idsPath, Value: anchorClause(s.last, w.wid)})
			w.judge = func(st *docState) (settle.Verdict, string) {
				switch {
				case st == nil:
					return settle.Unknown, whyGone
				case st.has(w.wid):
					return settle.Landed, ""
				case st.has(s.last):
					return settle.Live, ""
				}
				return settle.Unknown, "the anchor and the write's id are both gone from the document: more write ids than it keeps were added since, or it was deleted and inserted again"
			}
		}
		filter = withGuards(filter, guards)
		upd := r.guardedWrite(ops, w.wid, rec)
		w.send = func(ctx context.Context) (sent, error) {
			raw, err := r.coll.FindOneAndUpdate(ctx, filter, upd, afterOpts).Raw()
			if errors.Is(err, mongo.ErrNoDocuments) {
				return sent{}, nil
			}
			if err != nil {
				return sent{}, err
			}
			return sent{matched: true, after: raw}, nil
		}
		out, err := r.exec(ctx, r.policy(&cfg), w)
		if err != nil {
			return nil, r.dupOr(op, idv, err)
		}
		if out.Applied {
			st := out.Read
			if out.Reply != nil {
				if st, err = r.readState(op, idv, out.Reply); err != nil {
					return nil, err
				}
				r.cache.observe(ck, st)
			}
			return r.decode(op, idv, st)
		}
		st := out.Read
		if !out.HasRead {
			if st, err = r.reread(ctx, r.coll, op, idv, key); err != nil {
				return nil, err
			}
		}
		switch {
		case st == nil:
			r.cache.forget(ck)
			return nil, &NotFoundError{Op: op, ID: idv}
		case st.version == lastVersion:
			return nil, checkBase(op, r.opts.VersionField, st.version, true)
		case (s.last == 0 || st.has(s.last)) && (!pinned || st.version == s.version && st.same(s.meta)):
			// The anchor held: cond or a Where filter failed.
			return nil, r.guardError(ctx, op, idv, key, st.version, guards)
		case ctx.Err() == nil && (budget < 0 || time.Since(begun) < budget):
			r.cache.observe(ck, st)
			sn := st.seen()
			fresh = &sn
			continue // the re-read refreshed the anchor
		}
		if failed, err := r.guardsFail(ctx, op, idv, key, guards); err == nil && failed {
			return nil, r.guardError(ctx, op, idv, key, st.version, guards)
		}
		return nil, r.conflicted(ctx, &ConflictError{Op: op, ID: idv, Expected: s.version, Current: st.version})
	}
}

// checkOps checks an encoded update of Guarded (or WithSet's $set): allowed
// operators, each naming a path; paths the caller may write, with values
// their operator takes, none overlapping another; at most MongoDB's
// document size. It allocates only to say what is wrong.
func (r *Repo[T]) checkOps(op string, raw bson.Raw) error {
	var (
		err   error
		ops   int
		paths = make([][]byte, 0, 8)
	)
	bad := func(field, format string, args ...any) bool {
		err = &InvalidError{Op: op, Field: field, Reason: fmt.Sprintf(format, args...)}
		return false
	}
	var seenOps [4]bool // $set, $unset, $inc, $currentDate
	walked := elements(raw, func(name []byte, v bson.RawValue) bool {
		ops++
		if i := slices.Index([]string{"$set", "$unset", "$inc", "$currentDate"}, string(name)); i >= 0 {
			if seenOps[i] {
				return bad(string(name), "%s is given twice: name each operator once", name)
			}
			seenOps[i] = true
		}
		switch string(name) {
		case "$set", "$unset", "$inc", "$currentDate":
		case "$setOnInsert":
			return bad(string(name), "Guarded never inserts, so $setOnInsert would do nothing")
		default:
			return bad(string(name), "operator not allowed: use $set, $unset, $inc or $currentDate (the operators every target server runs)")
		}
		if v.Type != bson.TypeEmbeddedDocument {
			return bad(string(name), "the value of %s is a %s, want a document", name, v.Type)
		}
		fields := 0
		walked := elements(v.Value, func(path []byte, fv bson.RawValue) bool {
			fields++
			if err = r.checkPath(op, path); err != nil {
				return false
			}
			if err = checkOperand(op, name, path, fv); err != nil {
				return false
			}
			for _, p := range paths {
				if overlap(p, path) {
					return bad(string(path), "paths %q and %q overlap", p, path)
				}
			}
			paths = append(paths, path)
			return true
		})
		if walked && fields == 0 {
			return bad(string(name), "%s names no field", name)
		}
		return walked
	})
	switch {
	case err != nil:
		return err
	case !walked:
		return &InvalidError{Op: op, Field: "update", Reason: "malformed BSON"}
	case ops == 0:
		return &InvalidError{Op: op, Field: "update", Reason: "update has no operators"}
	case len(raw) > maxDocSize:
		return &InvalidError{Op: op, Field: "update", Reason: fmt.Sprintf("update is %d bytes: what it sets would make the document exceed MongoDB's %d-byte limit", len(raw), maxDocSize)}
	}
	return nil
}

// opsOf is a checked update as a bson.D of operators, each holding a bson.D
// of raw values.
func opsOf(raw bson.Raw) bson.D {
	var ops bson.D
	elements(raw, func(name []byte, v bson.RawValue) bool {
		var d bson.D
		elements(v.Value, func(path []byte, fv bson.RawValue) bool {
			d = append(d, bson.E{Key: string(path), Value: fv})
			return true
		})
		ops = append(ops, bson.E{Key: string(name), Value: d})
		return true
	})
	return ops
}

// overlap reports whether two update paths are equal or one is a prefix of
// the other at a segment boundary.
func overlap(a, b []byte) bool {
	if len(a) > len(b) {
		a, b = b, a
	}
	return bytes.HasPrefix(b, a) && (len(a) == len(b) || b[len(a)] == '.')
}

// encodeUpdate marshals an update (as it is, if it is encoded already).
func encodeUpdate(op string, update any) (bson.Raw, error) {
	if raw, ok := update.(bson.Raw); ok {
		return raw, nil
	}
	if update == nil {
		return nil, &InvalidError{Op: op, Field: "update", Reason: "update is nil"}
	}
	raw, err := bson.Marshal(update)
	if err != nil {
		return nil, &InvalidError{Op: op, Field: "update", Reason: "update cannot be encoded as a document", Err: err}
	}
	return raw, nil
}

// checkPath refuses an update path that is malformed or that touches what
// the repository owns: the id, the version, the write ids, a reserved or a
// shard-key field. It allocates only to say what is wrong.
func (r *Repo[T]) checkPath(op string, path []byte) error {
	bad := func(reason string) error { return &InvalidError{Op: op, Field: string(path), Reason: reason} }
	for seg := range bytes.SplitSeq(path, []byte{'.'}) {
		switch {
		case len(seg) == 0:
			return bad("path has an empty segment")
		case seg[0] == '$':
			return bad("path segment starts with '$' (positional and other $ paths are not supported)")
		}
	}
	root, _, _ := bytes.Cut(path, []byte{'.'})
	switch {
	case string(root) == "_id":
		return bad("the id cannot be changed")
	case string(root) == r.opts.VersionField:
		return bad("the version field is the repository's to change")
	case string(root) == r.opts.MetaField:
		return bad("the write-id field is the repository's to change")
	case slices.ContainsFunc(r.opts.Reserved, func(f string) bool { return string(root) == f }):
		return bad("the field is reserved (Options.Reserved) for another component, such as the lease package")
	}
	if r.shard.Enabled() {
		return r.checkShardPath(op, string(path))
	}
	return nil
}

// checkOperand checks the value an operator gives a path. It allocates
// only to say what is wrong.
func checkOperand(op string, name, path []byte, v bson.RawValue) error {
	switch string(name) {
	case "$inc":
		switch v.Type {
		case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble, bson.TypeDecimal128:
			return nil
		default:
		}
		return &InvalidError{Op: op, Field: string(path), Reason: fmt.Sprintf("$inc by a %s, want a number", v.Type)}
	case "$currentDate":
		if v.Type == bson.TypeBoolean {
			return nil
		}
		if v.Type == bson.TypeEmbeddedDocument {
			if t, ok := v.Document().Lookup("$type").StringValueOK(); ok && (t == "date" || t == "timestamp") {
				return nil
			}
		}
		return &InvalidError{Op: op, Field: string(path), Reason: `$currentDate takes true or {"$type": "date"|"timestamp"}`}
	case "$set":
		if (v.Type != bson.TypeEmbeddedDocument && v.Type != bson.TypeArray) || walkOK(v.Value, true) {
			return nil
		}
		return checkKeys(op, v.Value, string(path))
	}
	return nil
}

package versioned

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Guarded applies the caller's update operators to the document with the
// given id if it matches cond, in one statement: one findOneAndUpdate whose
// filter is the id, cond and any Where filters, and whose update is the
// caller's operators (with any WithSet fields in its $set) plus $inc of the
// version by one (and the write id). The
// server evaluates cond and applies the update atomically, so no version
// needs to be read first and no conflict can occur: this is the call for
// hot counters such as stock or balances.
//
//	item, err := repo.Guarded(ctx, sku,
//		bson.D{{"stock", bson.D{{"$gte", qty}}}},
//		bson.D{{"$inc", bson.D{{"stock", -qty}}}})
//
// cond is a query filter (a bson.D, bson.M or anything that marshals to a
// BSON document); nil means no condition. update may use $set, $unset, $inc
// and $currentDate only (the operators every target server runs), on any
// path except the id, the version field, Options.MetaField and the reserved
// fields (Options.Reserved); two paths may not overlap, and the values
// $set may not exceed MongoDB's 16 MiB document limit. A bad update is an
// *InvalidError and nothing is sent. So is a write to a document at the
// largest version (math.MaxInt64-1): the filter requires a version below
// it, so that the $inc cannot wrap.
//
// Guarded returns the document as stored after the write. If cond (or a
// Where filter) does not match it returns a *GuardError, and a
// *NotFoundError if there is no such document: one re-read tells them
// apart.
//
// Guarded normally makes one round trip. Its filter requires an "anchor":
// the id of a write the document carried when the repository last saw it
// (or read it first, if it has not seen it), which makes sure that a copy
// of the write sent again cannot apply twice. If more than WriteIDs writes
// have landed since, the anchor is gone: Guarded reads once and sends
// again. If the reply is lost and the write turns out to have landed, the
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
	if update, err = r.withSets(op, update, cfg.sets); err != nil {
		return nil, err
	}
	ops, err := r.updateOps(op, update)
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
	exit, err := r.lines.enter(ctx, ck)
	if err != nil {
		return nil, wrapErr(op, idv, err)
	}
	defer exit()
	// An anchor pushed out (a busy document) makes Guarded re-read and
	// send again, for as long as the policy's time allows.
	budget, begun := r.policy(&cfg).MaxElapsedTime, time.Now()
	if budget == 0 {
		budget = DefaultRetryTime
	}
	for round := 0; ; round++ {
		s, ok := r.cache.lookup(ck)
		if !ok {
			st, err := r.find(ctx, op, idv, key, nil)
			if err != nil {
				return nil, err
			}
			s = seen{version: st.version, inc: st.inc, last: st.last(), ids: st.ids}
		}
		w := &write{op: op, id: idv, key: key, wid: newWriteID(), base: s.version}
		filter := key.Filter()
		// A document with no write id yet, or (on a server that ignores
		// $slice) a full list: pin the version and incarnation, and $set
		// the list exactly, which keeps the bound there.
		pinned := s.last == 0 || (round < 2 && countIDs(s.ids) >= WriteIDs && r.ignoresSlice(ctx))
		var ids []byte
		if pinned {
			if err := checkBase(op, r.opts.VersionField, s.version, true); err != nil {
				return nil, err
			}
			filter = append(filter, r.versionIs(s.version), r.incIs(s.inc))
			ids = exactIDs(s.ids, w.wid).Value
			w.judge = judgeCAS(w, s.inc, true)
		} else {
			// The version must be below the last one, so that $inc cannot
			// wrap it (a stored version written by another program). The
			// anchor: present while the write's own id, pushed after it,
			// cannot have been cut from the list.
			filter = append(filter, r.versionBelowLast(), bson.E{Key: r.idsPath(), Value: anchorClause(s.last, w.wid)})
			w.judge = func(st *docState) (verdict, string) {
				switch {
				case st == nil:
					return unknown, whyGone
				case st.has(w.wid):
					return landed, ""
				case st.has(s.last):
					return live, ""
				}
				return unknown, "the anchor and the write's id are both gone from the document: more write ids than it keeps were added since, or it was deleted and inserted again"
			}
		}
		filter = withGuards(filter, guards)
		upd := r.guardedWrite(ops, w.wid, ids)
		w.send = func(ctx context.Context) (sent, error) {
			raw, err := r.coll.FindOneAndUpdate(ctx, filter, upd, options.FindOneAndUpdate().SetReturnDocument(options.After)).Raw()
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
		if out.landed {
			st := out.reread
			if out.after != nil {
				if st, err = r.readState(op, idv, out.after); err != nil {
					return nil, err
				}
				r.cache.observe(ck, st)
			}
			return r.decode(op, idv, st)
		}
		st := out.reread
		if !out.read {
			if st, err = r.rereadNow(ctx, op, idv, key); err != nil {
				return nil, err
			}
		}
		switch {
		case st == nil:
			r.cache.forget(ck)
			return nil, &NotFoundError{Op: op, ID: idv}
		case st.version == lastVersion:
			return nil, checkBase(op, r.opts.VersionField, st.version, true)
		case !pinned && st.has(s.last), pinned && st.version == s.version && st.inc == s.inc:
			// The anchor held: cond or a Where filter failed.
			return nil, r.guardError(ctx, op, idv, key, st.version, guards)
		case ctx.Err() == nil && (budget < 0 || time.Since(begun) < budget):
			continue // the re-read refreshed the anchor
		}
		if failed, err := r.guardsFail(ctx, op, idv, key, guards); err == nil && failed {
			return nil, r.guardError(ctx, op, idv, key, st.version, guards)
		}
		return nil, r.conflicted(ctx, &ConflictError{Op: op, ID: idv, Expected: s.version, Current: st.version})
	}
}

// checkOps validates the caller's update of Guarded and returns it as a
// bson.D of operators, each holding a bson.D of raw values.
func (r *Repo[T]) checkOps(op string, update any) (bson.D, error) {
	bad := func(field, format string, args ...any) (bson.D, error) {
		return nil, &InvalidError{Op: op, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if update == nil {
		return bad("update", "update is nil")
	}
	raw, err := bson.Marshal(update)
	if err != nil {
		return nil, &InvalidError{Op: op, Field: "update", Reason: "update cannot be encoded as a document", Err: err}
	}
	elems, err := bson.Raw(raw).Elements()
	if err != nil {
		return nil, &InvalidError{Op: op, Field: "update", Reason: "malformed BSON", Err: err}
	}
	if len(elems) == 0 {
		return bad("update", "update has no operators")
	}
	var (
		ops   bson.D
		paths []string
	)
	for _, e := range elems {
		name, v := e.Key(), e.Value()
		switch name {
		case "$set", "$unset", "$inc", "$currentDate":
		case "$setOnInsert":
			return bad(name, "Guarded never inserts, so $setOnInsert would do nothing")
		default:
			return bad(name, "operator not allowed: use $set, $unset, $inc or $currentDate (the operators every target server runs)")
		}
		if v.Type != bson.TypeEmbeddedDocument {
			return bad(name, "the value of %s is a %s, want a document", name, v.Type)
		}
		fields, err := v.Document().Elements()
		if err != nil || len(fields) == 0 {
			return bad(name, "%s names no field", name)
		}
		d := make(bson.D, 0, len(fields))
		for _, f := range fields {
			path, fv := f.Key(), f.Value()
			if err := r.checkPath(op, path); err != nil {
				return nil, err
			}
			if err := checkOperand(op, name, path, fv); err != nil {
				return nil, err
			}
			for _, p := range paths {
				if p == path || strings.HasPrefix(path, p+".") || strings.HasPrefix(p, path+".") {
					return bad(path, "paths %q and %q overlap", p, path)
				}
			}
			paths = append(paths, path)
			d = append(d, bson.E{Key: path, Value: fv})
		}
		ops = append(ops, bson.E{Key: name, Value: d})
	}
	if len(raw) > maxDocSize {
		return bad("update", "update is %d bytes: what it sets would make the document exceed MongoDB's %d-byte limit", len(raw), maxDocSize)
	}
	return ops, nil
}

// checkPath refuses an update path that is malformed or that touches what
// the repository owns: the id, the version and the write ids.
func (r *Repo[T]) checkPath(op, path string) error {
	segs := strings.Split(path, ".")
	for _, s := range segs {
		switch {
		case s == "":
			return &InvalidError{Op: op, Field: path, Reason: "path has an empty segment"}
		case strings.HasPrefix(s, "$"):
			return &InvalidError{Op: op, Field: path, Reason: "path segment starts with '$' (positional and other $ paths are not supported)"}
		}
	}
	switch segs[0] {
	case "_id":
		return &InvalidError{Op: op, Field: path, Reason: "the id cannot be changed"}
	case r.opts.VersionField:
		return &InvalidError{Op: op, Field: path, Reason: "the version field is the repository's to change"}
	case r.opts.MetaField:
		return &InvalidError{Op: op, Field: path, Reason: "the write-id field is the repository's to change"}
	}
	if r.reserved(segs[0]) {
		return &InvalidError{Op: op, Field: path, Reason: "the field is reserved (Options.Reserved) for another component, such as the lease package"}
	}
	return r.checkShardPath(op, path)
}

// checkOperand checks the value an operator gives a path.
func checkOperand(op, name, path string, v bson.RawValue) error {
	switch name {
	case "$inc":
		switch v.Type {
		case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble, bson.TypeDecimal128:
			return nil
		default:
		}
		return &InvalidError{Op: op, Field: path, Reason: fmt.Sprintf("$inc by a %s, want a number", v.Type)}
	case "$currentDate":
		if v.Type == bson.TypeBoolean {
			return nil
		}
		if v.Type == bson.TypeEmbeddedDocument {
			if t, ok := v.Document().Lookup("$type").StringValueOK(); ok && (t == "date" || t == "timestamp") {
				return nil
			}
		}
		return &InvalidError{Op: op, Field: path, Reason: `$currentDate takes true or {"$type": "date"|"timestamp"}`}
	case "$set":
		return checkValueKeys(op, v, path)
	}
	return nil
}

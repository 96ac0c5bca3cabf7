package versioned

import (
	"context"
	"errors"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/internal/settle"
	"github.com/mongocas/mongocas/store"
)

// casOut is the outcome of a combined write.
type casOut struct {
	outcome
	// current is the document the write found instead of the version it
	// expected, when its reply carried it (the write did not apply).
	current *docState
	// plain says the write took the updateOne form where the pipeline
	// form was open to it: no conflict was expected (usePipe).
	plain bool
}

// casBatch sends the write of a batch made against read: the field changes,
// the version raised by k = len(wids), and the write ids appended, filtered
// on the key, the version and incarnation read, and the guards; see exec
// (to: see write.to).
// The ids are $set exactly (the last entries of the list read, then wids;
// recordIDs), except in the plain form, which $pushes its one id with
// $slice on a server that honours it.
func (r *Repo[T]) casBatch(ctx context.Context, op string, id any, key docKey, read *docState, set, unset bson.D, wids []int64, to []context.Context, cfg *writeConfig) (casOut, error) {
	k := int64(len(wids))
	base := read.version
	w := &write{op: op, id: id, key: key, wid: wids[k-1], base: base, to: to}
	// Where the server runs update pipelines, the same write as a
	// findOneAndUpdate that returns the document either way (DESIGN.md,
	// "Combining"), when a conflict is likely: the batch combines calls, or
	// the document conflicted within hotFor. Else the cheaper updateOne,
	// plain.
	ck := cacheKey(key)
	// Not on unfit metadata: the pipeline's condition reads the
	// incarnation through MetaField, which may then not be a document (an
	// array of documents yields a list, the write would change nothing and
	// turn pipelines off); the updateOne form pins the value read instead.
	usePipe := cfg.piped() && read.unfit.Type == 0 && r.usePipelines(ctx)
	plain := usePipe && k == 1 && !r.cache.hot(ck)
	usePipe = usePipe && !plain
	// The plain form $pushes its id: the server is not FerretDB v1
	// (usePipelines), the one that ignores $slice, so the server cuts the
	// list. Not onto a list it has not read (none, or unfit metadata,
	// which $push refuses and recordIDs replaces).
	push := plain && read.ids != nil
	filter := append(key.Filter(), r.versionIs(base), r.metaIs(read.meta))
	filter = withGuards(filter, cfg.guards)
	set = append(set, cfg.sets...)
	set = append(set, bson.E{Key: r.opts.VersionField, Value: base + k})
	var ids bson.RawValue
	if !push {
		var rec bson.E
		rec, ids = r.recordIDs(read.meta, wids...)
		set = append(set, rec)
	}
	update := bson.D{{Key: "$set", Value: set}}
	if len(unset) > 0 {
		update = append(update, bson.E{Key: "$unset", Value: unset})
	}
	if push {
		update = append(update, bson.E{Key: "$push", Value: pushID(r.idsPath, w.wid)})
	}
	var pipe rawPipeline
	if usePipe {
		pipe = r.casPipeline(read, set, unset)
		usePipe = pipe != nil
	}
	w.send = func(ctx context.Context) (sent, error) {
		if usePipe && !r.lines.noPipes.Load() {
			s, ok, err := r.sendPipeline(ctx, op, id, key, read, pipe, w.wid)
			if ok {
				return s, err
			}
		}
		return r.updateOne(ctx, filter, update)
	}
	w.judge = judgeSpan(w, read.inc, true, k)
	out, err := r.exec(ctx, r.policy(cfg), w)
	if err != nil {
		return casOut{outcome: out}, r.dupOr(op, id, err)
	}
	if out.Applied {
		inc := read.inc
		if out.Read != nil {
			inc = out.Read.inc
		}
		if push {
			// The list at base of the incarnation read is read.ids: the
			// one the $push appended to.
			ids = exactIDs(read.ids, wids...)
		}
		r.cache.put(ck, seen{version: base + k, last: w.wid, meta: meta{inc: inc, ids: ids.Value}})
		return casOut{outcome: out}, nil
	}
	r.cache.conflicted(ck)
	var cur *docState
	if out.Reply != nil {
		if cur, err = r.readState(op, id, out.Reply); err != nil {
			return casOut{outcome: out}, err
		}
		r.cache.observe(ck, cur)
	}
	return casOut{outcome: out, current: cur, plain: plain}, nil
}

// updateOne sends an updateOne write once.
func (r *Repo[T]) updateOne(ctx context.Context, filter, update any) (sent, error) {
	res, err := r.coll.UpdateOne(ctx, filter, update)
	if err != nil {
		return sent{}, err
	}
	return sent{matched: res.MatchedCount == 1}, nil
}

// afterOpts returns the document after a findOneAndUpdate.
var afterOpts = options.FindOneAndUpdate().SetReturnDocument(options.After)

// sendPipeline sends the pipeline form of a CAS write whose last write id is
// wid. It reports ok false, having changed nothing, when the server refuses
// update pipelines or ran one wrongly: the updateOne form from then on.
func (r *Repo[T]) sendPipeline(ctx context.Context, op string, id any, key docKey, read *docState, pipe rawPipeline, wid int64) (s sent, ok bool, err error) {
	raw, err := r.coll.FindOneAndUpdate(ctx, key.Filter(), pipe, afterOpts).Raw()
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return sent{}, true, nil // gone: the next read says so
	case err != nil && refusesPipeline(err):
		r.lines.noPipes.Store(true)
		return sent{}, false, nil
	case err != nil:
		return sent{}, true, err
	}
	st, err := r.readState(op, id, raw)
	switch {
	case err != nil:
		return sent{}, true, err
	case st.has(wid):
		return sent{matched: true, after: raw}, true, nil
	case st.version == read.version && st.inc == read.inc:
		// The condition held, yet nothing changed: this server does not
		// run the pipeline as MongoDB does. Do without it.
		r.lines.noPipes.Store(true)
		return sent{}, false, nil
	}
	return sent{after: raw}, true, nil
}

// usePipelines reports whether the CAS write may take its pipeline form: not
// on FerretDB v1 (store.Server.Kind; if it fails, this write does without),
// nor once sendPipeline turned it off for the collection.
func (r *Repo[T]) usePipelines(ctx context.Context) bool {
	if r.lines.noPipes.Load() {
		return false
	}
	kind, err := r.server.Kind(ctx)
	return err == nil && kind != store.FerretDBv1
}

// ignoresSlice reports whether the server ignores $slice in $push
// (FerretDB v1; store.Server.Kind, from buildInfo asked once per client).
func (r *Repo[T]) ignoresSlice(ctx context.Context) bool {
	kind, err := r.server.Kind(ctx)
	return err == nil && kind == store.FerretDBv1
}

// Error codes of a server that refuses an update pipeline.
const (
	codeFailedToParse  = 9
	codeNotImplemented = 238
)

// refusesPipeline reports whether err is a server's refusal of an update
// pipeline as such (a command it did not run), not a failure of the write.
func refusesPipeline(err error) bool {
	var se mongo.ServerError
	if !errors.As(err, &se) || store.IsAmbiguous(err) {
		return false
	}
	return se.HasErrorCode(codeNotImplemented) || se.HasErrorCode(codeFailedToParse)
}

// judgeSpan judges a write filtered on version == w.base (and, if
// incKnown, incarnation inc) that makes k versions and appends k write ids,
// the last w.wid (DESIGN.md, "The judges" and "Combining").
func judgeSpan(w *write, inc int64, incKnown bool, k int64) func(*docState) (settle.Verdict, string) {
	return func(st *docState) (settle.Verdict, string) {
		switch {
		case st == nil:
			return settle.Unknown, whyGone
		case st.has(w.wid):
			return settle.Landed, ""
		case incKnown && st.inc != inc:
			return settle.Unknown, whyOther
		case st.version == w.base:
			return settle.Live, ""
		case st.version > w.base && st.version-w.base-(k-1) <= countIDs(st.ids):
			return settle.Dead, ""
		case st.version > w.base:
			return settle.Unknown, whyFar
		}
		return settle.Unknown, whyUnrelated
	}
}

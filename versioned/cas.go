package versioned

import (
	"context"
	"encoding/binary"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/store"
)

// casOut is the outcome of a combined write.
type casOut struct {
	outcome
	// current is the document the write found instead of the version it
	// expected, when its reply carried it (the write did not apply).
	current *docState
}

// casBatch sends the write of a batch made against read, the document as
// read: the field changes, the version raised by k = len(wids) (one per
// combined change), and the list of write ids $set to its last WriteIDs-k
// entries and wids, filtered on the id, the version and incarnation read,
// and the guards. See exec for what happens when it fails ambiguously.
func (r *Repo[T]) casBatch(ctx context.Context, op string, id any, key bson.RawValue, read *docState, set, unset bson.D, wids []string, cfg *writeConfig) (casOut, error) {
	k := int64(len(wids))
	base := read.version
	w := &write{op: op, id: id, key: key, wid: wids[k-1], base: base}
	filter := append(store.IDFilter(key), r.versionIs(base), r.incIs(read.inc))
	filter = withGuards(filter, cfg.guards)
	set = append(set,
		bson.E{Key: r.opts.VersionField, Value: base + k},
		bson.E{Key: r.idsPath(), Value: exactIDsN(read, wids)})
	update := bson.D{{Key: "$set", Value: set}}
	if len(unset) > 0 {
		update = append(update, bson.E{Key: "$unset", Value: unset})
	}
	w.send = func(ctx context.Context) (sent, error) {
		res, err := r.coll.UpdateOne(ctx, filter, update)
		if err != nil {
			return sent{}, err
		}
		return sent{matched: res.MatchedCount == 1}, nil
	}
	w.judge = judgeSpan(w, read.inc, k)
	out, err := r.exec(ctx, r.policy(cfg), w)
	if err != nil {
		return casOut{outcome: out}, r.dupOr(op, id, err)
	}
	if out.landed {
		inc := read.inc
		if out.reread != nil {
			inc = out.reread.inc
		}
		r.cache.put(cacheKey(key), seen{version: base + k, inc: inc, last: w.wid})
	}
	return casOut{outcome: out}, nil
}

// judgeSpan judges a write filtered on version == w.base and incarnation
// inc that makes k versions at once (a combined write) and appends k write
// ids, the last of them w.wid. It is judgeCAS for k writes landing in one
// statement: had it landed, it made versions base+1 .. base+k, so its last
// id stays listed while the document is less than n versions (its number
// of ids) past base+k-1. See DESIGN.md, "Combining".
func judgeSpan(w *write, inc string, k int64) func(*docState) (verdict, string) {
	return func(st *docState) (verdict, string) {
		switch {
		case st == nil:
			return unknown, whyGone
		case st.has(w.wid):
			return landed, ""
		case st.inc != inc:
			return unknown, whyOther
		case st.version == w.base:
			return live, ""
		case st.version > w.base && st.version-w.base-(k-1) <= st.nids():
			return dead, ""
		case st.version > w.base:
			return unknown, whyFar
		}
		return unknown, whyUnrelated
	}
}

// exactIDsN is the list of write ids after a write that appends wids to
// the document st as read: its last WriteIDs-len(wids) entries and wids, as
// a BSON array. exactIDs is exactIDsN of one id.
func exactIDsN(st *docState, wids []string) bson.RawValue {
	k := int64(len(wids))
	skip := max(st.nids()-(WriteIDs-k), 0)
	buf := make([]byte, 4, 5+WriteIDs*(len(wids[0])+9))
	i := 0
	for it := st.iter(); ; {
		id, ok := it.next()
		if !ok {
			break
		}
		if skip > 0 {
			skip--
			continue
		}
		buf = appendIDElement(buf, i, id)
		i++
	}
	for _, wid := range wids {
		buf = appendIDElement(buf, i, []byte(wid))
		i++
	}
	buf = append(buf, 0)
	binary.LittleEndian.PutUint32(buf, uint32(len(buf))) //nolint:gosec // at most WriteIDs short ids

	return bson.RawValue{Type: bson.TypeArray, Value: buf}
}

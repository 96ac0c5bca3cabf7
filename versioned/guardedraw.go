package versioned

import (
	"encoding/binary"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// updateOps marshals Guarded's update, adds the WithSet fields sets to its
// $set, and checks the whole (checkOps, an overlap of the two included):
// the operators every target server runs, on paths the caller may write,
// none overlapping another. A bad update is an *InvalidError, nothing sent.
func (r *Repo[T]) updateOps(op string, update any, sets bson.D) (bson.Raw, error) {
	raw, err := encodeUpdate(op, update)
	if err != nil {
		return nil, err
	}
	if len(sets) > 0 {
		if err := r.checkOps(op, raw); err != nil {
			return nil, err
		}
		ops := opsOf(raw)
		if i := slices.IndexFunc(ops, func(e bson.E) bool { return e.Key == "$set" }); i >= 0 {
			ops[i].Value = append(ops[i].Value.(bson.D), sets...) //nolint:forcetypeassert // opsOf's form
		} else {
			ops = append(ops, bson.E{Key: "$set", Value: sets})
		}
		if raw, err = encodeUpdate(op, ops); err != nil {
			return nil, err
		}
	}
	if err := r.checkOps(op, raw); err != nil {
		return nil, err
	}
	if !wellFormed(raw) {
		return nil, &InvalidError{Op: op, Field: "update", Reason: "malformed BSON"}
	}
	return raw, nil
}

// guardedWrite merges the caller's encoded update ops (checked by
// updateOps) with the repository's part of a write with id wid: $inc of the
// version by one, and the $push of wid onto the list of write ids, cut to
// its last WriteIDs entries; or, if rec has a key (the write pins the
// version it was read at), rec in the $set (recordIDs).
func (r *Repo[T]) guardedWrite(ops bson.Raw, wid int64, rec bson.E) bson.Raw {
	var ids bson.RawValue
	if rec.Key != "" {
		ids = rec.Value.(bson.RawValue) //nolint:forcetypeassert // recordIDs' form
	}
	b := make([]byte, 4, len(ops)+len(r.opts.VersionField)+len(rec.Key)+len(ids.Value)+96)
	var hasInc, hasSet bool
	elements(ops, func(name []byte, v bson.RawValue) bool {
		var start int
		b, start = openDoc(b, name)
		b = append(b, v.Value[4:len(v.Value)-1]...)
		switch string(name) {
		case "$inc":
			hasInc = true
			b = appendInt64(b, r.opts.VersionField, 1)
		case "$set":
			hasSet = true
			b = appendRaw(b, rec.Key, ids)
		}
		b = closeDoc(b, start)
		return true
	})
	var start int
	if !hasInc {
		b, start = openDoc(b, []byte("$inc"))
		b = appendInt64(b, r.opts.VersionField, 1)
		b = closeDoc(b, start)
	}
	if !hasSet && ids.Type != 0 {
		b, start = openDoc(b, []byte("$set"))
		b = appendRaw(b, rec.Key, ids)
		b = closeDoc(b, start)
	}
	if ids.Type == 0 {
		b = append(b, byte(bson.TypeEmbeddedDocument))
		b = append(b, "$push"...)
		b = append(b, 0)
		b = append(b, pushID(r.idsPath, wid)...)
	}
	return closeDoc(b, 0)
}

// appendRaw appends the element key: v, if v has a type.
func appendRaw(b []byte, key string, v bson.RawValue) []byte {
	if v.Type == 0 {
		return b
	}
	b = append(b, byte(v.Type))
	b = append(b, key...)
	b = append(b, 0)
	return append(b, v.Value...)
}

// anchorClause is the filter value {$eq: last, $ne: wid}: the document
// still lists last, and not yet wid.
func anchorClause(last, wid int64) bson.Raw {
	b := make([]byte, 4, 32)
	b = appendInt64(b, "$eq", last)
	b = appendInt64(b, "$ne", wid)
	return closeDoc(b, 0)
}

// openDoc appends the header of an embedded document element key, and
// returns where its length goes.
func openDoc(b []byte, key []byte) ([]byte, int) {
	b = append(b, byte(bson.TypeEmbeddedDocument))
	b = append(b, key...)
	b = append(b, 0)
	start := len(b)
	return binary.LittleEndian.AppendUint32(b, 0), start
}

// closeDoc ends the document (or array) whose length goes at start.
func closeDoc(b []byte, start int) []byte {
	b = append(b, 0)
	binary.LittleEndian.PutUint32(b[start:], uint32(len(b)-start)) //nolint:gosec // bounded by the update
	return b
}

// belowLastDefault is versionBelowLast's value for the default version
// field, boxed once.
var belowLastDefault any = bson.D{{Key: "$not", Value: bson.D{{Key: "$gte", Value: int64(lastVersion)}}}}

package versioned

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"reflect"
	"slices"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// maxDocSize is MongoDB's limit on a stored document (maxBsonObjectSize).
const maxDocSize = 16 << 20

// docState is a stored document as read: its raw bytes, its version, and
// what the write-id protocol keeps in Options.MetaField.
type docState struct {
	raw     bson.Raw
	version int64
	meta
}

// meta is a document's write-id metadata (Options.MetaField) as read. Every
// write that records write ids takes its filter clause (Repo.metaIs) and its
// $set of the ids (Repo.recordIDs) from it, so one rule decides, on every
// write path, what a write does with metadata it cannot extend.
type meta struct {
	// inc is the incarnation id Insert stamped, 0 for a document not
	// inserted by a repository.
	inc int64
	// ids holds the ids of the document's last writes, oldest first (nil:
	// none, or unfit).
	ids bson.RawArray
	// unfit is MetaField's value when no write can extend it: there but not
	// a document, or a document whose list of ids is there but not an array
	// (another program's null, say); Type 0 otherwise. A write treats such
	// a document as one with no metadata, and $sets MetaField afresh.
	unfit bson.RawValue
}

// Names inside Options.MetaField.
const (
	metaInc = "inc" // the incarnation id, stamped once by Insert
	metaIDs = "ids" // the ids of the last WriteIDs writes, oldest first
)

// Versions.
const (
	// startVersions bounds the version Insert starts a document at: below
	// 2^52, exact in clients that hold numbers as float64 (JavaScript).
	startVersions = 1 << 52
	// lastVersion is the largest version a document can have: the next
	// would overflow int64. A stored version above it is a *VersionTypeError.
	lastVersion = math.MaxInt64 - 1
)

// startVersion returns the version of a newly inserted document: random in
// [1, 2^52) (DESIGN.md, "Versions name their incarnation").
func startVersion() int64 { return 1 + mrand.Int64N(startVersions-1) }

// readState parses the version of a stored document and its write-id
// metadata. No version field is version 0; an integer up to lastVersion, or
// a double holding one (as mongosh writes numbers), is that version;
// anything else is a *VersionTypeError.
func (r *Repo[T]) readState(op string, id any, raw bson.Raw) (*docState, error) {
	st := &docState{raw: raw}
	if m, err := raw.LookupErr(r.opts.MetaField); err == nil {
		if m.Type != bson.TypeEmbeddedDocument {
			st.unfit = m
		} else {
			d := m.Document()
			if v := d.Lookup(metaInc); v.Type != 0 {
				inc, ok := asInt(v)
				if !ok || inc == 0 {
					return nil, &VersionTypeError{Op: op, ID: id, Field: r.incPath, Value: v}
				}
				st.inc = inc // an int64, or a number a tool rewrote as a double
			}
			if v := d.Lookup(metaIDs); v.Type != 0 {
				if a, ok := v.ArrayOK(); ok {
					st.ids = a
				} else {
					st.unfit = m
				}
			}
		}
	}
	v := raw.Lookup(r.opts.VersionField)
	if v.Type == 0 { // no version field
		return st, nil
	}
	ver, ok := asInt(v)
	if !ok || ver < 0 || ver > lastVersion {
		return nil, &VersionTypeError{Op: op, ID: id, Field: r.opts.VersionField, Value: v}
	}
	st.version = ver
	return st, nil
}

// idIter walks a list of write ids, oldest first, without allocating.
type idIter struct{ rest []byte }

func idsIter(ids bson.RawArray) idIter {
	if len(ids) < 5 {
		return idIter{}
	}
	return idIter{rest: ids[4:]}
}

// next returns the next id (0 for an element that is not an int64, such as
// an id of an earlier protocol), and false at the end.
func (it *idIter) next() (int64, bool) {
	if len(it.rest) < 2 {
		return 0, false
	}
	t := bsoncore.Type(it.rest[0])
	k := bytes.IndexByte(it.rest[1:], 0)
	if k < 0 {
		return 0, false
	}
	v, rem, ok := bsoncore.ReadValue(it.rest[2+k:], t)
	if !ok {
		return 0, false
	}
	it.rest = rem
	id, _ := v.Int64OK()
	return id, true
}

// has reports whether the document carries write id wid.
func (st *docState) has(wid int64) bool {
	for it := idsIter(st.ids); ; {
		id, ok := it.next()
		if !ok {
			return false
		}
		if id == wid {
			return true
		}
	}
}

// countIDs is the number of write ids in a list (ids of an earlier
// protocol not counted: invariant L then just knows less).
func countIDs(ids bson.RawArray) int64 {
	var n int64
	for it := idsIter(ids); ; {
		id, ok := it.next()
		if !ok {
			return n
		}
		if id != 0 {
			n++
		}
	}
}

// last is the id of the document's last write, or 0.
func (st *docState) last() int64 {
	var last int64
	for it := idsIter(st.ids); ; {
		id, ok := it.next()
		if !ok {
			return last
		}
		last = id
	}
}

// asInt reads an integer: an int32, an int64, or a double that holds an
// integer exactly (mongosh writes numbers as doubles).
func asInt(v bson.RawValue) (int64, bool) {
	switch v.Type {
	case bson.TypeInt32:
		return int64(v.Int32()), true
	case bson.TypeInt64:
		return v.Int64(), true
	case bson.TypeDouble:
		if f := v.Double(); f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			return int64(f), true
		}
	default:
	}
	return 0, false
}

// checkKeys reports the first field name of an encoded document (or array)
// that MongoDB would misread ('$' prefix or '.'), at any depth, with its
// path. It allocates only to say what is wrong.
func checkKeys(op string, doc []byte, path string) error {
	if walkOK(doc, true) {
		return nil
	}
	var err error
	walked := elements(doc, func(k []byte, v bson.RawValue) bool {
		p := string(k)
		if path != "" {
			p = path + "." + p
		}
		if err = checkKey(string(k)); err != nil {
			err = &InvalidError{Op: op, Field: p, Reason: err.Error()}
		} else if v.Type == bson.TypeEmbeddedDocument || v.Type == bson.TypeArray {
			err = checkKeys(op, v.Value, p)
		}
		return err == nil
	})
	if err == nil && !walked {
		err = &InvalidError{Op: op, Field: path, Reason: "malformed BSON"}
	}
	return err
}

// wellFormed reports whether doc is a well-formed encoded document at every
// depth.
func wellFormed(doc []byte) bool { return walkOK(doc, false) }

// walkOK walks an encoded document, at every depth, without allocating:
// false if it is malformed, or (if keys) has a field name MongoDB would not
// read as written.
func walkOK(doc []byte, keys bool) bool {
	return elements(doc, func(k []byte, v bson.RawValue) bool {
		if keys && ((len(k) > 0 && k[0] == '$') || bytes.IndexByte(k, '.') >= 0) {
			return false
		}
		return (v.Type != bson.TypeEmbeddedDocument && v.Type != bson.TypeArray) || walkOK(v.Value, keys)
	})
}

// elements calls fn with the key and value of each element of the encoded
// document doc, in order, without allocating, until fn returns false. It
// reports false if fn did, or if doc is malformed.
func elements(doc []byte, fn func(key []byte, v bson.RawValue) bool) bool {
	if len(doc) < 5 || int(binary.LittleEndian.Uint32(doc)) != len(doc) || doc[len(doc)-1] != 0 {
		return false
	}
	for rest := doc[4 : len(doc)-1]; len(rest) > 0; {
		el, r, ok := bsoncore.ReadElement(rest)
		if !ok {
			return false
		}
		v := el.Value()
		if !fn(el.KeyBytes(), bson.RawValue{Type: bson.Type(v.Type), Value: v.Data}) {
			return false
		}
		rest = r
	}
	return true
}

// encode marshals doc and checks it can be stored as it is.
func (r *Repo[T]) encode(op string, doc *T) (bson.Raw, error) {
	raw, err := bson.Marshal(doc)
	if err != nil {
		return nil, &InvalidError{Op: op, Reason: "document cannot be encoded", Err: err}
	}
	if len(raw) > maxDocSize {
		return nil, &InvalidError{Op: op, Reason: fmt.Sprintf("document is %d bytes, over MongoDB's %d-byte limit", len(raw), maxDocSize)}
	}
	if err := checkKeys(op, raw, ""); err != nil {
		return nil, err
	}
	return raw, nil
}

// fullDiff returns the $set of every mapped field of next and the $unset of
// the mapped fields next omits, for Update. The id, the version, reserved
// fields and fields T does not map are never touched.
func (r *Repo[T]) fullDiff(next bson.Raw) (set, unset bson.D, err error) {
	if err := next.Validate(); err != nil {
		return nil, nil, err
	}
	for _, k := range r.s.names {
		if !r.own(k) {
			continue
		}
		if v, err := next.LookupErr(k); err == nil {
			set = append(set, bson.E{Key: k, Value: v})
		} else {
			unset = append(unset, bson.E{Key: k, Value: ""})
		}
	}
	return set, unset, nil
}

// own reports whether the top-level field k is one that Update and Modify
// write: mapped by T, and neither the id, the version, reserved nor a
// shard-key field.
func (r *Repo[T]) own(k string) bool {
	return k != "_id" && k != r.opts.VersionField && !r.reserved(k) && !r.shard.Has(k)
}

// reserved reports whether k is one of Options.Reserved.
func (r *Repo[T]) reserved(k string) bool {
	return slices.Contains(r.opts.Reserved, k)
}

// versionIs is the filter clause "the version is v"; version 0 also
// matches a document with no version field.
func (r *Repo[T]) versionIs(v int64) bson.E {
	if v == 0 {
		return bson.E{Key: "$or", Value: bson.A{
			bson.D{{Key: r.opts.VersionField, Value: int64(0)}},
			bson.D{{Key: r.opts.VersionField, Value: bson.D{{Key: "$exists", Value: false}}}},
		}}
	}
	return bson.E{Key: r.opts.VersionField, Value: v}
}

// versionBelowLast is the filter clause "the version is below lastVersion"
// (or absent): a write that raises the version by one cannot overflow.
func (r *Repo[T]) versionBelowLast() bson.E {
	if r.opts.VersionField == DefaultVersionField {
		return bson.E{Key: DefaultVersionField, Value: belowLastDefault}
	}
	return bson.E{Key: r.opts.VersionField, Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gte", Value: int64(lastVersion)}}}}}
}

// checkBase refuses, before anything is sent, a write that would make
// version base+1 (next) or remove version base (!next) when base is not a
// version a document can have, or is the last one and next is true.
func checkBase(op, field string, base int64, next bool) error {
	switch {
	case base < 0:
		return &InvalidError{Op: op, Field: field, Reason: "version is negative"}
	case base > lastVersion:
		return &InvalidError{Op: op, Field: field, Reason: fmt.Sprintf("version %d is above the largest a document can have (%d)", base, int64(lastVersion))}
	case next && base == lastVersion:
		return &InvalidError{Op: op, Field: field, Reason: fmt.Sprintf("the document is at version %d, the largest it can have: another write would overflow the version", base)}
	}
	return nil
}

// incIs is the filter clause "the document is incarnation inc" (0: one
// not inserted by a repository, which has none).
func (r *Repo[T]) incIs(inc int64) bson.E {
	if inc == 0 {
		return bson.E{Key: r.incPath, Value: bson.D{{Key: "$exists", Value: false}}}
	}
	return bson.E{Key: r.incPath, Value: inc}
}

// withGuards ANDs the guards' filters (the Where filters, and cond for
// Guarded) into filter, inside $and so that their keys cannot collide with
// the repository's own.
func withGuards(filter bson.D, guards []guard) bson.D {
	if len(guards) == 0 {
		return filter
	}
	and := make(bson.A, len(guards))
	for i, g := range guards {
		and[i] = g.filter
	}
	return append(filter, bson.E{Key: "$and", Value: and})
}

// metaIs is the filter clause that pins a document's metadata as read: its
// incarnation (incIs) or, where it is unfit, MetaField's very value, so
// that the write that replaces it applies to that value only.
func (r *Repo[T]) metaIs(m meta) bson.E {
	if m.unfit.Type != 0 {
		return bson.E{Key: r.opts.MetaField, Value: m.unfit}
	}
	return r.incIs(m.inc)
}

// recordIDs is the $set element of a write, pinned to the version m was
// read at (metaIs), that appends wids to the list: the exact list
// (exactIDs) at MetaField.ids or, where m is unfit, MetaField afresh, as
// for a document with no metadata, keeping its incarnation id if it has
// one: {inc, ids: wids}. It also returns the list after the write.
func (r *Repo[T]) recordIDs(m meta, wids ...int64) (bson.E, bson.RawValue) {
	ids := exactIDs(m.ids, wids...)
	if m.unfit.Type == 0 {
		return bson.E{Key: r.idsPath, Value: ids}, ids
	}
	b := make([]byte, 4, 32+len(ids.Value))
	if m.inc != 0 {
		b = appendInt64(b, metaInc, m.inc)
	}
	b = bsoncore.AppendArrayElement(b, metaIDs, ids.Value)
	return bson.E{Key: r.opts.MetaField, Value: bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: closeDoc(b, 0)}}, ids
}

// exact reports whether a write can $set the list from m exactly
// (recordIDs): m holds the list read, or unfit metadata.
func (m meta) exact() bool { return m.ids != nil || m.unfit.Type != 0 }

// same reports whether two reads of a document's metadata are the same
// incarnation's, and equally unfit.
func (m meta) same(o meta) bool {
	return m.inc == o.inc && m.unfit.Type == o.unfit.Type && bytes.Equal(m.unfit.Value, o.unfit.Value)
}

// metaPath is the path of name in the metadata subdocument meta.
func metaPath(meta, name string) string { return meta + "." + name }

// pushID is the $push document {path: {$each: [wid], $slice: -WriteIDs}},
// encoded directly.
func pushID(path string, wid int64) bson.Raw {
	b := make([]byte, 4, 64+len(path))
	b, doc := openDoc(b, []byte(path))
	each, b := bsoncore.AppendArrayElementStart(b, "$each")
	b = appendIDElement(b, 0, wid)
	b, _ = bsoncore.AppendArrayEnd(b, each)
	b = bsoncore.AppendInt32Element(b, "$slice", -WriteIDs)
	b = closeDoc(b, doc)
	return closeDoc(b, 0)
}

// exactIDs is the list of write ids after a write, pinned to the version
// ids were read at, that appends wids: its last WriteIDs-len(wids) entries
// and wids, as a BSON array (ids of an earlier protocol dropped). $set, it
// keeps the bound on servers that ignore $slice (FerretDB v1).
func exactIDs(ids bson.RawArray, wids ...int64) bson.RawValue {
	skip := max(countIDs(ids)-(WriteIDs-int64(len(wids))), 0)
	buf := make([]byte, 4, 5+WriteIDs*12)
	i := 0
	for it := idsIter(ids); ; {
		id, ok := it.next()
		if !ok {
			break
		}
		if id == 0 {
			continue
		}
		if skip > 0 {
			skip--
			continue
		}
		buf = appendIDElement(buf, i, id)
		i++
	}
	for _, wid := range wids {
		buf = appendIDElement(buf, i, wid)
		i++
	}
	return bson.RawValue{Type: bson.TypeArray, Value: closeDoc(buf, 0)}
}

// decode decodes a stored document into a new T, with its version.
func (r *Repo[T]) decode(op string, id any, st *docState) (*T, error) {
	t := new(T)
	if err := bson.Unmarshal(st.raw, t); err != nil {
		return nil, wrapErr(op, id, fmt.Errorf("decode: %w", err))
	}
	r.s.setVersion(reflect.ValueOf(t).Elem(), st.version)
	return t, nil
}

// appendIDElement appends the array element i holding the id.
func appendIDElement(buf []byte, i int, id int64) []byte {
	buf = append(buf, byte(bson.TypeInt64))
	buf = strconv.AppendInt(buf, int64(i), 10)
	buf = append(buf, 0)
	return binary.LittleEndian.AppendUint64(buf, uint64(id)) //nolint:gosec // two's complement, as BSON stores it
}

// withMeta returns the encoded document raw with the write-id subdocument
// of a new incarnation appended as field meta: {inc: wid, ids: [wid]}.
func withMeta(raw bson.Raw, meta string, wid int64) bson.Raw {
	out := make([]byte, 0, len(raw)+len(meta)+48)
	out = append(out, raw[:len(raw)-1]...)
	out, sub := openDoc(out, []byte(meta))
	out = bsoncore.AppendInt64Element(out, metaInc, wid)
	arr, out := bsoncore.AppendArrayElementStart(out, metaIDs)
	out = appendIDElement(out, 0, wid)
	out, _ = bsoncore.AppendArrayEnd(out, arr)
	out = closeDoc(out, sub)
	return closeDoc(out, 0)
}

// casPipeline is the update pipeline of a CAS write against read: each
// field of set (which holds the version and the write ids) and unset takes
// its new value if the version and incarnation are still read's. It is
// built as bytes (nil if a value cannot be encoded: the updateOne form).
func (r *Repo[T]) casPipeline(read *docState, set, unset bson.D) rawPipeline {
	cond := r.casCond(read)
	b := make([]byte, 4, 64+len(set)*(len(cond)+64)+len(unset)*(len(cond)+48)+len(read.raw))
	stage, b := bsoncore.AppendDocumentElementStart(b, "0")
	fields, b := bsoncore.AppendDocumentElementStart(b, "$set")
	for i, n := 0, len(set)+len(unset); i < n; i++ {
		var (
			key  string
			v    bson.RawValue // the new value; none: removed
			f, c int32
		)
		if i < len(set) {
			key = set[i].Key
			var ok bool
			if v, ok = set[i].Value.(bson.RawValue); !ok {
				t, data, err := bson.MarshalValue(set[i].Value)
				if err != nil {
					return nil
				}
				v = bson.RawValue{Type: t, Value: data}
			}
		} else {
			key = unset[i-len(set)].Key
		}
		f, b = bsoncore.AppendDocumentElementStart(b, key)
		c, b = bsoncore.AppendArrayElementStart(b, "$cond")
		b = bsoncore.AppendDocumentElement(b, "0", cond)
		if v.Type == 0 {
			b = bsoncore.AppendStringElement(b, "1", "$$REMOVE")
		} else {
			var lit int32
			lit, b = bsoncore.AppendDocumentElementStart(b, "1")
			b = bsoncore.AppendValueElement(b, "$literal", bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
			b, _ = bsoncore.AppendDocumentEnd(b, lit)
		}
		b = appendFieldPath(b, "2", key)
		b, _ = bsoncore.AppendArrayEnd(b, c)
		b, _ = bsoncore.AppendDocumentEnd(b, f)
	}
	b, _ = bsoncore.AppendDocumentEnd(b, fields)
	b, _ = bsoncore.AppendDocumentEnd(b, stage)
	return closeDoc(b, 0)
}

// casCond is the pipeline's condition C: the version and the incarnation
// are read's, a missing one counting as 0 (version 0 is also a document
// without a version field; incarnation 0, one without an incarnation):
// {$and: [{$eq: [{$ifNull: ["$version", 0]}, v]}, {$eq: [.. "$_mc.inc" .., inc]}]}.
func (r *Repo[T]) casCond(read *docState) bson.Raw {
	b := make([]byte, 4, 128+len(r.opts.VersionField)+len(r.opts.MetaField))
	and, b := bsoncore.AppendArrayElementStart(b, "$and")
	for i, e := range [2]struct {
		path string
		v    int64
	}{{r.opts.VersionField, read.version}, {r.incPath, read.inc}} {
		var eq, args, ifNull, nullArgs int32
		eq, b = bsoncore.AppendDocumentElementStart(b, [2]string{"0", "1"}[i])
		args, b = bsoncore.AppendArrayElementStart(b, "$eq")
		ifNull, b = bsoncore.AppendDocumentElementStart(b, "0")
		nullArgs, b = bsoncore.AppendArrayElementStart(b, "$ifNull")
		b = appendFieldPath(b, "0", e.path)
		b = bsoncore.AppendInt64Element(b, "1", 0)
		b, _ = bsoncore.AppendArrayEnd(b, nullArgs)
		b, _ = bsoncore.AppendDocumentEnd(b, ifNull)
		b = bsoncore.AppendInt64Element(b, "1", e.v)
		b, _ = bsoncore.AppendArrayEnd(b, args)
		b, _ = bsoncore.AppendDocumentEnd(b, eq)
	}
	b, _ = bsoncore.AppendArrayEnd(b, and)
	return closeDoc(b, 0)
}

// appendFieldPath appends the string element key: "$path".
func appendFieldPath(b []byte, key, path string) []byte {
	b = append(b, byte(bson.TypeString))
	b = append(append(b, key...), 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(path)+2)) //nolint:gosec // a field name
	return append(append(append(b, '$'), path...), 0)
}

// rawPipeline is an update pipeline encoded as a BSON array.
type rawPipeline []byte

// MarshalBSONValue gives the driver the pipeline as it is.
func (p rawPipeline) MarshalBSONValue() (byte, []byte, error) { return byte(bson.TypeArray), p, nil }

// appendInt64 appends the int64 element key: v.
func appendInt64(b []byte, key string, v int64) []byte {
	return bsoncore.AppendInt64Element(b, key, v)
}

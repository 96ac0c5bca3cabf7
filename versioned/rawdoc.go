package versioned

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// maxDocSize is MongoDB's limit on a stored document (maxBsonObjectSize).
const maxDocSize = 16 << 20

// docState is a stored document as read: its raw bytes and its version.
type docState struct {
	raw     bson.Raw
	version int64
}

// readState parses the version of a stored document. A missing field is
// version 0 (a document written before the repository was adopted); an
// integer, or a double holding an integer (as mongosh writes numbers), is
// that version; anything else is a *VersionTypeError.
func (r *Repo[T]) readState(op string, id any, raw bson.Raw) (*docState, error) {
	v := raw.Lookup(r.opts.VersionField)
	if v.Type == 0 { // no version field
		return &docState{raw: raw}, nil
	}
	ver, ok := asInt(v)
	if !ok || ver < 0 {
		return nil, &VersionTypeError{Op: op, ID: id, Field: r.opts.VersionField, Value: v}
	}
	return &docState{raw: raw, version: ver}, nil
}

// writes returns the write-id subdocument of a stored document, or nil.
func (r *Repo[T]) writes(raw bson.Raw) bson.Raw {
	v, err := raw.LookupErr(r.opts.MetaField, "w")
	if err != nil || v.Type != bson.TypeEmbeddedDocument {
		return nil
	}
	return v.Document()
}

// landed reports whether the stored document carries write id wid.
func (r *Repo[T]) landed(st *docState, wid string) bool {
	w := r.writes(st.raw)
	if w == nil {
		return false
	}
	_, err := w.LookupErr(wid)
	return err == nil
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

// maxPrune bounds the write ids one write removes, to keep its update small.
const maxPrune = 64

// checkKeys walks an encoded document and reports the first field name
// MongoDB would misread ('$' prefix or '.'), with its path.
func checkKeys(op string, doc bson.Raw, path string) error {
	elems, err := doc.Elements()
	if err != nil {
		return &InvalidError{Op: op, Field: path, Reason: "malformed BSON", Err: err}
	}
	for _, e := range elems {
		k := e.Key()
		p := k
		if path != "" {
			p = path + "." + k
		}
		if err := checkKey(k); err != nil {
			return &InvalidError{Op: op, Field: p, Reason: err.Error()}
		}
		if err := checkValueKeys(op, e.Value(), p); err != nil {
			return err
		}
	}
	return nil
}

func checkValueKeys(op string, v bson.RawValue, path string) error {
	switch v.Type {
	case bson.TypeEmbeddedDocument:
		return checkKeys(op, v.Document(), path)
	case bson.TypeArray:
		vals, err := v.Array().Values()
		if err != nil {
			return &InvalidError{Op: op, Field: path, Reason: "malformed BSON", Err: err}
		}
		for i, x := range vals {
			if err := checkValueKeys(op, x, path+"."+strconv.Itoa(i)); err != nil {
				return err
			}
		}
	default: // a scalar has no field names
	}
	return nil
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

// diff returns the $set and $unset of the mapped fields of next against
// prev (nil prev: every field of next is set). The id, the version and
// fields T does not map are never touched.
func (r *Repo[T]) diff(prev, next bson.Raw) (set, unset bson.D, err error) {
	elems, err := next.Elements()
	if err != nil {
		return nil, nil, err
	}
	for _, e := range elems {
		k := e.Key()
		if k == "_id" || k == r.opts.VersionField {
			continue
		}
		v := e.Value()
		if prev != nil {
			if old, err := prev.LookupErr(k); err == nil && old.Type == v.Type && bytes.Equal(old.Value, v.Value) {
				continue
			}
		}
		set = append(set, bson.E{Key: k, Value: v})
	}
	for k := range r.s.mapped {
		if k == "_id" || k == r.opts.VersionField {
			continue
		}
		if _, err := next.LookupErr(k); err == nil {
			continue
		}
		if prev != nil {
			if _, err := prev.LookupErr(k); err != nil {
				continue // absent before and after
			}
		}
		unset = append(unset, bson.E{Key: k, Value: ""})
	}
	return set, unset, nil
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

// writeKey is the path of write id wid in the document.
func (r *Repo[T]) writeKey(wid string) string { return r.opts.MetaField + ".w." + wid }

// decode decodes a stored document into a new T, with its version.
func (r *Repo[T]) decode(op string, id any, st *docState) (*T, error) {
	t := new(T)
	if err := bson.Unmarshal(st.raw, t); err != nil {
		return nil, wrapErr(op, id, fmt.Errorf("decode: %w", err))
	}
	r.s.setVersion(reflect.ValueOf(t).Elem(), st.version)
	return t, nil
}

// Package shard turns a collection's shard key into the equality clauses
// that route each command versioned and lease send to the one shard that
// owns the document: the one place that checks a shard key and its values.
package shard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/store"
)

// Spec is a checked shard key: the dotted paths of its fields other than
// _id (every filter has the _id's equality already), in the order
// configured. The zero Spec has no field.
type Spec struct{ paths []string }

// Parse checks fields, an Options.ShardKey: dotted paths of non-empty
// segments not starting with '$', without NUL, none named twice or under
// another. owned says why a top-level field cannot be in a shard key, or ""
// when it can. Fields under _id are dropped.
func Parse(fields []string, owned func(root string) string) (Spec, error) {
	var s Spec
	for _, f := range fields {
		if err := checkPath(f); err != nil {
			return Spec{}, err
		}
		root, _, _ := strings.Cut(f, ".")
		if root == "_id" {
			continue
		}
		if why := owned(root); why != "" {
			return Spec{}, fmt.Errorf("field %q %s: a shard-key value must never change", f, why)
		}
		if p, ok := s.Touches(f); ok {
			return Spec{}, fmt.Errorf("fields %q and %q overlap", p, f)
		}
		s.paths = append(s.paths, f)
	}
	return s, nil
}

func checkPath(f string) error {
	if strings.ContainsRune(f, 0) {
		return fmt.Errorf("field %q contains a NUL byte", f)
	}
	for seg := range strings.SplitSeq(f, ".") {
		switch {
		case seg == "":
			return fmt.Errorf("field %q has an empty segment", f)
		case strings.HasPrefix(seg, "$"):
			return fmt.Errorf("field %q has a segment that starts with '$'", f)
		}
	}
	return nil
}

// Enabled reports whether ids must come with shard-key values.
func (s Spec) Enabled() bool { return len(s.paths) > 0 }

// Paths returns the fields, in the order configured.
func (s Spec) Paths() []string { return slices.Clone(s.paths) }

// Has reports whether path is one of the fields.
func (s Spec) Has(path string) bool { return slices.Contains(s.paths, path) }

// String lists the fields for messages: "(region, accountId)".
func (s Spec) String() string { return "(" + strings.Join(s.paths, ", ") + ")" }

// Values are one document's shard-key values, one per path of its Spec.
type Values struct {
	paths []string
	vals  []bson.RawValue
}

// Doc names one document in a filter: its encoded _id (checked by
// store.CheckID) and its shard-key values (none without a shard key).
type Doc struct {
	ID    bson.RawValue
	Shard Values
}

// Filter is store.IDFilter's {_id: id} (or {_id: {$eq: id}}) and {field:
// {$eq: value}} for each shard-key field: a fresh slice the caller may
// append to.
func (d Doc) Filter() bson.D {
	return append(store.IDFilter(d.ID), d.Shard.Clauses()...)
}

// Split takes what a caller passed as an id, a store.Key or a bare id, and
// returns the bare id and the checked shard-key values. Errors are
// *store.IDError, matching store.ErrInvalidID.
func (s Spec) Split(id any) (any, Values, error) {
	switch k := id.(type) {
	case *store.Key:
		return nil, Values{}, &store.IDError{ID: id, Reason: "pass a Key, not a *Key"}
	case store.Key:
		switch k.ID.(type) {
		case store.Key, *store.Key:
			return nil, Values{}, &store.IDError{ID: id, Reason: "Key.ID is itself a Key"}
		}
		if len(k.Shard) == 0 && !s.Enabled() {
			return k.ID, Values{}, nil
		}
		v, err := s.fromKey(k)
		return k.ID, v, err
	}
	if s.Enabled() {
		return nil, Values{}, &store.IDError{ID: id, Reason: fmt.Sprintf("the collection's shard key is %s: pass a Key with the id and the value of each shard-key field", s)}
	}
	return id, Values{}, nil
}

func (s Spec) fromKey(k store.Key) (Values, error) {
	if !s.Enabled() {
		return Values{}, &store.IDError{ID: k, Reason: "no shard key is configured (Options.ShardKey), but the Key holds shard-key values"}
	}
	v := Values{paths: s.paths, vals: make([]bson.RawValue, len(s.paths))}
	for _, e := range k.Shard {
		i := slices.Index(s.paths, e.Key)
		switch {
		case i < 0:
			return Values{}, &store.IDError{ID: k, Reason: fmt.Sprintf("%q is not a field of the shard key %s", e.Key, s)}
		case v.vals[i].Type != 0:
			return Values{}, &store.IDError{ID: k, Reason: fmt.Sprintf("shard-key field %q is named twice", e.Key)}
		}
		raw, err := store.CheckValue(e.Value)
		if err != nil {
			return Values{}, fieldError(k, e.Key, err)
		}
		v.vals[i] = raw
	}
	for i, raw := range v.vals {
		if raw.Type == 0 {
			return Values{}, &store.IDError{ID: k, Reason: fmt.Sprintf("shard-key field %q is missing (the shard key is %s)", s.paths[i], s)}
		}
	}
	return v, nil
}

// FromDoc returns the shard-key values an encoded document holds, checked
// as Split checks a Key's. id is the document's id, for errors.
func (s Spec) FromDoc(doc bson.Raw, id any) (Values, error) {
	if !s.Enabled() {
		return Values{}, nil
	}
	v := Values{paths: s.paths, vals: make([]bson.RawValue, len(s.paths))}
	for i, p := range s.paths {
		raw, err := doc.LookupErr(strings.Split(p, ".")...)
		if err != nil {
			return Values{}, &store.IDError{ID: id, Reason: fmt.Sprintf("the document has no shard-key field %q (the shard key is %s)", p, s)}
		}
		if _, err := store.CheckValue(raw); err != nil {
			return Values{}, fieldError(id, p, err)
		}
		v.vals[i] = raw
	}
	return v, nil
}

func fieldError(id any, path string, err error) error {
	reason := err.Error()
	if ide := (*store.IDError)(nil); errors.As(err, &ide) {
		reason = ide.Reason
	}
	return &store.IDError{ID: id, Reason: fmt.Sprintf("shard-key field %q: %s", path, reason)}
}

// Touches returns the shard-key field an update of path would change: one
// equal to path, under it, or above it. ok is false when there is none.
func (s Spec) Touches(path string) (field string, ok bool) {
	for _, p := range s.paths {
		if p == path || strings.HasPrefix(p, path+".") || strings.HasPrefix(path, p+".") {
			return p, true
		}
	}
	return "", false
}

// Clauses returns {path: {$eq: value}} for each field, for a filter: $eq
// keeps a value a value. nil for the zero Values.
func (v Values) Clauses() bson.D {
	if len(v.paths) == 0 {
		return nil
	}
	d := make(bson.D, len(v.paths))
	for i, p := range v.paths {
		d[i] = bson.E{Key: p, Value: bson.D{{Key: "$eq", Value: v.vals[i]}}}
	}
	return d
}

// Ident identifies the values in a cache key: equal for equal values, with
// numbers compared by value (int32 7, int64 7 and 7.0 are one to $eq).
func (v Values) Ident() string {
	if len(v.vals) == 0 {
		return ""
	}
	var b []byte
	for _, raw := range v.vals {
		if n, ok := integral(raw); ok {
			b = append(b, 'i')
			b = binary.LittleEndian.AppendUint64(b, uint64(n)) //nolint:gosec // a bit pattern, not a size
			continue
		}
		b = append(b, byte(raw.Type))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(raw.Value))) //nolint:gosec // a BSON value's length fits
		b = append(b, raw.Value...)
	}
	return string(b)
}

// String formats the values for messages: region="eu", accountId=7.
func (v Values) String() string {
	parts := make([]string, len(v.paths))
	for i, p := range v.paths {
		parts[i] = p + "=" + v.vals[i].String()
	}
	return strings.Join(parts, ", ")
}

// Differs returns the first field under the top-level field root whose
// value in val (as an update would write root; present false when it
// removes root) is not the one in v; ok is false when there is none.
func (v Values) Differs(root string, val bson.RawValue, present bool) (field string, ok bool) {
	for i, p := range v.paths {
		r, rest, nested := strings.Cut(p, ".")
		if r != root {
			continue
		}
		if !present {
			return p, true
		}
		got := val
		if nested {
			doc, isDoc := val.DocumentOK()
			if !isDoc {
				return p, true
			}
			var err error
			if got, err = doc.LookupErr(strings.Split(rest, ".")...); err != nil {
				return p, true
			}
		}
		if !Same(got, v.vals[i]) {
			return p, true
		}
	}
	return "", false
}

// Same reports whether a and b are one value to the server's $eq: the same
// type and bytes, or numbers of equal value.
func Same(a, b bson.RawValue) bool {
	if x, ok := integral(a); ok {
		y, ok := integral(b)
		return ok && x == y
	}
	return a.Type == b.Type && string(a.Value) == string(b.Value)
}

// integral reads an int32, an int64 or a double that holds an integer
// exactly.
func integral(v bson.RawValue) (int64, bool) {
	switch v.Type {
	case bson.TypeInt32:
		if n, ok := v.Int32OK(); ok {
			return int64(n), true
		}
	case bson.TypeInt64:
		return v.Int64OK()
	case bson.TypeDouble:
		if f, ok := v.DoubleOK(); ok && f == math.Trunc(f) && math.Abs(f) < 1<<63 {
			return int64(f), true
		}
	default:
	}
	return 0, false
}

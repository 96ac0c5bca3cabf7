package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// The error vocabulary shared by every mongocas package: each exports these
// under its own name, with the same value.
var (
	// ErrInvalid is matched by every error that refuses a caller's input
	// (an id, an option, a field name, an update) before anything is sent to
	// the server. Nothing was written. A service maps it to HTTP 400.
	ErrInvalid = errors.New("invalid input")

	// ErrInvalidID is matched by an error that refuses an id (see CheckID):
	// nil, a zero value, or one that could act as an operator or pattern.
	// Every error that matches ErrInvalidID also matches ErrInvalid.
	ErrInvalidID = &sentinel{msg: "invalid id", parent: ErrInvalid}

	// ErrUnknownOutcome is matched by an error that reports a write whose
	// outcome could not be settled (see UnknownOutcomeError): it may or may
	// not have been applied. A caller that needs to know reads again later.
	ErrUnknownOutcome = errors.New("write outcome unknown")
)

// sentinel is a sentinel error that also matches a more general one.
type sentinel struct {
	msg    string
	parent error
}

func (s *sentinel) Error() string        { return s.msg }
func (s *sentinel) Is(target error) bool { return target == s.parent }

// IDError refuses an id. It matches ErrInvalidID and ErrInvalid.
type IDError struct {
	// ID is the refused id, as the caller passed it.
	ID any
	// Reason says why, in words a developer can act on.
	Reason string
}

// Error names the id (shortened if long) and the reason.
func (e *IDError) Error() string {
	return fmt.Sprintf("invalid id %s: %s", shortValue(e.ID), e.Reason)
}

// Is reports whether target is ErrInvalidID or ErrInvalid.
func (e *IDError) Is(target error) bool { return target == ErrInvalidID || target == ErrInvalid }

// shortValue formats v for an error message, cut to 64 bytes.
func shortValue(v any) string {
	s := fmt.Sprintf("%#v", v)
	if _, ok := v.(string); ok {
		s = fmt.Sprintf("%q", v)
	}
	const maxLen = 64
	if len(s) > maxLen {
		s = s[:maxLen] + "…"
	}
	return s
}

// CheckID reports whether id can name exactly one document by equality, and
// returns its BSON encoding. It refuses, with an *IDError and before anything
// is sent: nil, a nil pointer, map, slice or interface, and the zero value of
// any type; a value the driver cannot encode; null, undefined, regular
// expressions, JavaScript code, DBPointer, MinKey, MaxKey and arrays; and
// documents, at any depth, with a key that starts with '$' or is empty, or
// that hold any of the refused types. The result is meant for IDFilter.
func CheckID(id any) (bson.RawValue, error) {
	// The common id types, without reflection.
	switch v := id.(type) {
	case string:
		if v != "" {
			b := make([]byte, 4, 4+len(v)+1)
			binary.LittleEndian.PutUint32(b, uint32(len(v)+1)) //nolint:gosec // a string in memory
			return bson.RawValue{Type: bson.TypeString, Value: append(append(b, v...), 0)}, nil
		}
	case bson.ObjectID:
		if !v.IsZero() {
			return bson.RawValue{Type: bson.TypeObjectID, Value: v[:]}, nil
		}
	}
	if id == nil {
		return bson.RawValue{}, &IDError{ID: id, Reason: "id is nil"}
	}
	rv := reflect.ValueOf(id)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface:
		if rv.IsNil() {
			return bson.RawValue{}, &IDError{ID: id, Reason: fmt.Sprintf("id is a nil %T", id)}
		}
	default:
	}
	if rv.IsZero() {
		return bson.RawValue{}, &IDError{ID: id, Reason: fmt.Sprintf("id is the zero %T", id)}
	}
	t, data, err := bson.MarshalValue(id)
	if err != nil {
		return bson.RawValue{}, &IDError{ID: id, Reason: "id cannot be encoded: " + err.Error()}
	}
	raw := bson.RawValue{Type: t, Value: data}
	if why := refusedValue(raw, 0); why != "" {
		return bson.RawValue{}, &IDError{ID: id, Reason: why}
	}
	return raw, nil
}

// maxIDDepth bounds the nesting CheckID walks; deeper ids are refused.
const maxIDDepth = 16

// refusedValue returns why v cannot be (part of) an id, or "".
func refusedValue(v bson.RawValue, depth int) string {
	switch v.Type {
	case bson.TypeNull, bson.TypeUndefined:
		return "id is null"
	case bson.TypeRegex:
		return "id is a regular expression"
	case bson.TypeJavaScript, bson.TypeCodeWithScope:
		return "id is JavaScript code"
	case bson.TypeDBPointer:
		return "id is a DBPointer"
	case bson.TypeMinKey, bson.TypeMaxKey:
		return "id is MinKey or MaxKey"
	case bson.TypeArray:
		if depth == 0 {
			return "id is an array (MongoDB refuses an array _id)"
		}
		return refusedElements(v.Value, depth, false)
	case bson.TypeEmbeddedDocument:
		return refusedElements(v.Value, depth, true)
	default:
		return ""
	}
}

// refusedElements checks the elements of an encoded document or array.
func refusedElements(data []byte, depth int, isDoc bool) string {
	if depth >= maxIDDepth {
		return fmt.Sprintf("id is nested more than %d levels deep", maxIDDepth)
	}
	elems, err := bson.Raw(data).Elements()
	if err != nil {
		return "id does not encode to valid BSON: " + err.Error()
	}
	for _, e := range elems {
		key := e.Key()
		if isDoc && (key == "" || strings.HasPrefix(key, "$")) {
			return fmt.Sprintf("id holds the key %q: a key that starts with '$' (or is empty) is an operator, not a value", key)
		}
		if why := refusedValue(e.Value(), depth+1); why != "" {
			return why
		}
	}
	return ""
}

// IDFilter returns the filter of the document with an id checked by
// CheckID: {_id: raw} for a string or an ObjectID, which no server reads as
// an operator (and FerretDB v1 finds by its primary key, where it scans
// for any other filter), else {_id: {$eq: raw}}: the $eq keeps a document
// a value.
func IDFilter(raw bson.RawValue) bson.D {
	if raw.Type == bson.TypeString || raw.Type == bson.TypeObjectID {
		return bson.D{{Key: "_id", Value: raw}}
	}
	return bson.D{{Key: "_id", Value: bson.D{{Key: "$eq", Value: raw}}}}
}

// CheckContext reports whether ctx can be used for a call that does I/O: it
// returns an error matching ErrInvalid for a nil ctx, and ContextError(ctx)
// when ctx has already ended.
func CheckContext(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalid)
	}
	return ContextError(ctx)
}

// ContextError returns ctx.Err(), joined with context.Cause(ctx) when the
// cause is a different error, or nil while ctx has not ended.
func ContextError(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// NoSession returns ctx without the driver session it may carry, for
// mongocas's own commands (probes, clock readings, lease records), which
// must not run inside the caller's transaction nor share its session.
func NoSession(ctx context.Context) context.Context {
	if mongo.SessionFromContext(ctx) != nil {
		return mongo.NewSessionContext(ctx, nil)
	}
	return ctx
}

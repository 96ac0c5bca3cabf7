package versioned

import (
	"fmt"
	"reflect"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/store"
)

// schema is what New learns about T by reflection, once: where the id and
// the version live and which top-level BSON names T maps.
type schema struct {
	typ      reflect.Type
	idIndex  []int
	idType   reflect.Type
	verIndex []int
	verName  string
	// mapped holds, for every top-level BSON name T can write (_id and the
	// version included), the index path of its field. A name that is mapped
	// but absent from an encoded document was removed (a nil omitempty
	// field, say) and is $unset.
	mapped map[string][]int
	// names lists the mapped names in field order.
	names []string
}

var (
	tMarshaler      = reflect.TypeFor[bson.Marshaler]()
	tValueMarshaler = reflect.TypeFor[bson.ValueMarshaler]()
)

// describe reflects over T, a struct type, the way the driver's default
// struct codec does: the bson tag names a field, or else its lowercased Go
// name; "-" skips it; "inline" flattens an embedded struct.
func describe(typ reflect.Type, verName, meta string) (*schema, error) {
	if typ.Kind() != reflect.Struct {
		return nil, invalidType(typ, "is not a struct")
	}
	for _, t := range []reflect.Type{typ, reflect.PointerTo(typ)} {
		if t.Implements(tMarshaler) || t.Implements(tValueMarshaler) {
			return nil, invalidType(typ, "has its own BSON marshaler, so its fields cannot be known")
		}
	}
	s := &schema{typ: typ, verName: verName, mapped: map[string][]int{}}
	if err := s.walk(typ, nil); err != nil {
		return nil, err
	}
	switch {
	case s.idIndex == nil:
		return nil, invalidType(typ, `has no field mapped to "_id" (tag one with bson:"_id")`)
	case s.verIndex == nil:
		return nil, invalidType(typ, fmt.Sprintf("has no int64 field mapped to %q (tag one with bson:%q, or set Options.VersionField)", verName, verName))
	}
	if _, ok := s.mapped[meta]; ok {
		return nil, invalidType(typ, fmt.Sprintf("maps the field %q that the repository keeps its write ids in (set Options.MetaField to another name)", meta))
	}
	return s, nil
}

func (s *schema) walk(typ reflect.Type, prefix []int) error {
	for i := range typ.NumField() {
		sf := typ.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, inline, skip := parseTag(sf)
		if skip {
			continue
		}
		index := append(append([]int(nil), prefix...), i)
		if inline {
			switch ft := sf.Type; ft.Kind() {
			case reflect.Struct:
				if err := s.walk(ft, index); err != nil {
					return err
				}
				continue
			case reflect.Map:
				return invalidType(s.typ, fmt.Sprintf("inlines the map %s: every field the struct does not map would then be rewritten by each write, which defeats keeping unmapped fields", sf.Name))
			default:
				return invalidType(s.typ, fmt.Sprintf("inlines %s, which is not a struct value (inline pointers are not supported)", sf.Name))
			}
		}
		if err := checkKey(name); err != nil {
			return invalidType(s.typ, fmt.Sprintf("field %s: %v", sf.Name, err))
		}
		if _, dup := s.mapped[name]; dup {
			return invalidType(s.typ, fmt.Sprintf("maps the BSON name %q twice", name))
		}
		s.mapped[name] = index
		s.names = append(s.names, name)
		switch name {
		case "_id":
			s.idIndex, s.idType = index, sf.Type
		case s.verName:
			if sf.Type.Kind() != reflect.Int64 {
				return invalidType(s.typ, fmt.Sprintf("version field %s is a %s, want int64", sf.Name, sf.Type))
			}
			s.verIndex = index
		}
	}
	return nil
}

// parseTag mirrors the driver's default struct tag parser.
func parseTag(sf reflect.StructField) (name string, inline, skip bool) {
	name = strings.ToLower(sf.Name)
	tag, ok := sf.Tag.Lookup("bson")
	if !ok && !strings.Contains(string(sf.Tag), ":") && len(sf.Tag) > 0 {
		tag = string(sf.Tag)
	}
	if tag == "-" {
		return "", false, true
	}
	for i, part := range strings.Split(tag, ",") {
		if i == 0 && part != "" {
			name = part
		}
		if part == "inline" {
			inline = true
		}
	}
	return name, inline, false
}

// checkKey reports why a field name cannot be stored as is: MongoDB reads a
// leading '$' as an operator and a '.' as a path into a subdocument.
func checkKey(k string) error {
	switch {
	case strings.HasPrefix(k, "$"):
		return fmt.Errorf("field name %q starts with '$'", k)
	case strings.Contains(k, "."):
		return fmt.Errorf("field name %q contains '.'", k)
	}
	return nil
}

func invalidType(typ reflect.Type, reason string) error {
	return &InvalidError{Op: "new", Reason: fmt.Sprintf("type %s %s", typ, reason)}
}

// idOf returns the id of doc.
func (s *schema) idOf(v reflect.Value) reflect.Value { return v.FieldByIndex(s.idIndex) }

// versionOf returns the version held in doc.
func (s *schema) versionOf(v reflect.Value) int64 { return v.FieldByIndex(s.verIndex).Int() }

// setVersion stores ver in doc.
func (s *schema) setVersion(v reflect.Value, ver int64) { v.FieldByIndex(s.verIndex).SetInt(ver) }

// checkID converts a caller's id to the type of T's id field and encodes
// it as the driver encodes it inside a document. It refuses an id that
// cannot identify a document: nil, the zero value, of another type than the
// id field's (integers of another integer type are converted when the
// value fits), or whose encoding could act as a query operator or pattern
// (store.CheckID: $-keys at any depth, regular expressions, code, arrays,
// null).
func (s *schema) checkID(op string, id any) (any, bson.RawValue, error) {
	bad := func(reason string) (any, bson.RawValue, error) {
		return nil, bson.RawValue{}, &InvalidError{Op: op, Field: "_id", Reason: reason}
	}
	if id == nil {
		return bad("id is nil")
	}
	v := reflect.ValueOf(id)
	if v.Type() != s.idType && s.idType.Kind() != reflect.Interface {
		conv, ok := convertInt(v, s.idType)
		if !ok {
			return bad(fmt.Sprintf("id %v has type %s, want %s", id, v.Type(), s.idType))
		}
		v = conv
	}
	if v.IsZero() {
		return bad(fmt.Sprintf("id is the zero %s", v.Type()))
	}
	raw, err := store.CheckID(v.Interface())
	if err != nil {
		return nil, bson.RawValue{}, &InvalidError{Op: op, Field: "_id", Err: err}
	}
	return v.Interface(), raw, nil
}

// convertInt converts an integer to another integer type when the value is
// kept exactly.
func convertInt(v reflect.Value, to reflect.Type) (reflect.Value, bool) {
	if !isInt(v.Kind()) || !isInt(to.Kind()) {
		return reflect.Value{}, false
	}
	c := v.Convert(to)
	if !c.Convert(v.Type()).Equal(v) || (isSigned(v.Kind()) && v.Int() < 0) != (isSigned(to.Kind()) && c.Int() < 0) {
		return reflect.Value{}, false
	}
	return c, true
}

func isInt(k reflect.Kind) bool { return isSigned(k) || (k >= reflect.Uint && k <= reflect.Uint64) }

func isSigned(k reflect.Kind) bool { return k >= reflect.Int && k <= reflect.Int64 }

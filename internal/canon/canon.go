// Package canon gives the one form of a value the server matches as equal
// to others of another BSON type, so that code can tell two ids or keys
// name one document without asking the server.
package canon

import (
	"math"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ID returns the canonical form of an id or key: an integer (int32, int64,
// or a double holding one) as an int64, since the server matches 7,
// NumberLong(7) and 7.0 as one value; any other value as it is.
func ID(v bson.RawValue) bson.RawValue {
	var n int64
	switch v.Type {
	case bson.TypeInt32:
		n = int64(v.Int32())
	case bson.TypeInt64:
		return v
	case bson.TypeDouble:
		f := v.Double()
		if f != math.Trunc(f) || f < -(1<<63) || f >= 1<<63 {
			return v
		}
		n = int64(f)
	default:
		return v
	}
	return bson.RawValue{Type: bson.TypeInt64, Value: bsoncore.AppendInt64(nil, n)}
}

// Same reports whether the server matches a and b as one id.
func Same(a, b bson.RawValue) bool { return ID(a).Equal(ID(b)) }

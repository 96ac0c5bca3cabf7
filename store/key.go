package store

import (
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Key names one document of a collection sharded on a key other than _id:
// its _id and the value of each field of the shard key. Pass a Key where a
// mongocas call takes an id when the repository or Manager was configured
// with the shard key (Options.ShardKey): every command the call sends then
// filters on an equality with each value, so that mongos routes it to the
// one shard that owns the document.
//
//	acct, err := repo.Get(ctx, versioned.Key{ID: "acct-7", Shard: bson.D{
//		{Key: "region", Value: "eu"}, {Key: "accountId", Value: int64(7)},
//	}})
//
// Shard names every field of the configured shard key once, by its dotted
// path, in any order; each value is checked by [CheckValue]. A Key with an
// empty Shard is its ID alone, for a repository or Manager without a shard
// key. The call refuses, with an error matching [ErrInvalidID] and before
// anything is sent, a Key that misses a field, names one that is not in the
// shard key, or holds a value CheckValue refuses; and a bare id where the
// shard key is configured.
type Key struct {
	// ID is the document's _id, checked as any id is (see CheckID).
	ID any
	// Shard holds the shard-key fields and their values: {path, value}.
	Shard bson.D
}

// String formats the key for messages: the id, then the shard-key values.
func (k Key) String() string {
	if len(k.Shard) == 0 {
		return fmt.Sprint(k.ID)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%v (", k.ID)
	for i, e := range k.Shard {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%v", e.Key, e.Value)
	}
	b.WriteString(")")
	return b.String()
}

// CheckValue reports whether v can be compared by equality in a filter, as
// a shard-key value, and returns its BSON encoding. It refuses, with an
// *IDError, the values [CheckID] refuses (arrays included: MongoDB refuses
// one in a shard key) except zero values, since a shard-key field may hold 0
// or "". A bson.RawValue is checked as it is encoded.
func CheckValue(v any) (bson.RawValue, error) {
	raw, ok := v.(bson.RawValue)
	if !ok {
		if v == nil {
			return bson.RawValue{}, &IDError{ID: v, Reason: "value is nil"}
		}
		t, data, err := bson.MarshalValue(v)
		if err != nil {
			return bson.RawValue{}, &IDError{ID: v, Reason: "value cannot be encoded: " + err.Error()}
		}
		raw = bson.RawValue{Type: t, Value: data}
	}
	switch raw.Type {
	case 0:
		return bson.RawValue{}, &IDError{ID: v, Reason: "value is missing"}
	case bson.TypeArray:
		return bson.RawValue{}, &IDError{ID: v, Reason: "value is an array (MongoDB refuses an array in a shard key)"}
	default:
	}
	if why := refusedValue(raw, 0); why != "" {
		if rest, ok := strings.CutPrefix(why, "id "); ok {
			why = "value " + rest
		}
		return bson.RawValue{}, &IDError{ID: v, Reason: why}
	}
	return raw, nil
}

package move

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestAcceptThatReadsAFieldACreditWritesIsNotStatic: a run's credits are
// checked together only when Accept reads no field a credit changes.
func TestAcceptThatReadsAFieldACreditWritesIsNotStatic(t *testing.T) {
	written := []string{"balance", "_mv", "version", "_mc"}
	for _, c := range []struct {
		name   string
		accept bson.D
		static bool
	}{
		{"none", nil, true},
		{"another field", bson.D{{Key: "closed", Value: bson.D{{Key: "$ne", Value: true}}}}, true},
		{"the id", bson.D{{Key: "_id", Value: bson.D{{Key: "$ne", Value: "x"}}}}, true},
		{"the value", bson.D{{Key: "balance", Value: bson.D{{Key: "$lt", Value: 25}}}}, false},
		{"the value, nested in $or", bson.D{{Key: "$or", Value: bson.A{bson.D{{Key: "open", Value: true}}, bson.D{{Key: "balance", Value: 0}}}}}, false},
		{"the version", bson.D{{Key: "version", Value: bson.D{{Key: "$lt", Value: 9}}}}, false},
		{"the state", bson.D{{Key: "_mv.n", Value: 0}}, false},
		{"the metadata", bson.D{{Key: "_mc.ids", Value: bson.D{{Key: "$size", Value: 3}}}}, false},
		{"deferred's stamps", bson.D{{Key: "_deferred", Value: bson.D{{Key: "$exists", Value: false}}}}, false},
		{"an expression", bson.D{{Key: "$expr", Value: true}}, false},
		{"an expression, nested", bson.D{{Key: "$and", Value: bson.A{bson.D{{Key: "$where", Value: "true"}}}}}, false},
	} {
		if got := staticAccept(c.accept, written...); got != c.static {
			t.Errorf("%s: static %v, want %v", c.name, got, c.static)
		}
	}
}

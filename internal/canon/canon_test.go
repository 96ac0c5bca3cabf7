package canon_test

import (
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/internal/canon"
)

func raw(t *testing.T, v any) bson.RawValue {
	t.Helper()
	typ, data, err := bson.MarshalValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return bson.RawValue{Type: typ, Value: data}
}

func TestSameTellsIdsTheServerMatchesAsOne(t *testing.T) {
	for _, c := range []struct {
		a, b any
		same bool
	}{
		{int32(7), int64(7), true},
		{int64(7), 7.0, true},
		{int32(-3), -3.0, true},
		{7.5, 7.5, true},
		{int64(7), 7.5, false},
		{int64(7), int64(8), false},
		{"7", int64(7), false},
		{math.Pow(2, 63), int64(math.MaxInt64), false}, // out of int64: kept a double
		{"ana", "ana", true},
	} {
		if got := canon.Same(raw(t, c.a), raw(t, c.b)); got != c.same {
			t.Errorf("Same(%v (%T), %v (%T)) = %v, want %v", c.a, c.a, c.b, c.b, got, c.same)
		}
	}
}

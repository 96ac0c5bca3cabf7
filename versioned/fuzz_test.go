package versioned

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

type fuzzDoc struct {
	ID      string `bson:"_id"`
	N       int64  `bson:"n"`
	Version int64  `bson:"version"`
}

func fuzzRepo(t testing.TB) *Repo[fuzzDoc] {
	t.Helper()
	o, err := (*Options)(nil).resolve()
	if err != nil {
		t.Fatal(err)
	}
	s, err := describe(reflect.TypeFor[fuzzDoc](), o.VersionField, o.MetaField)
	if err != nil {
		t.Fatal(err)
	}
	return &Repo[fuzzDoc]{s: s, opts: o, cache: newDocCache(), idsPath: metaPath(o.MetaField, metaIDs), incPath: metaPath(o.MetaField, metaInc)}
}

func seedDocs(f *testing.F) {
	f.Helper()
	for _, d := range []any{
		bson.M{"$inc": bson.M{"n": -3}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "a.b", Value: bson.M{"c": "$x"}}}}, {Key: "$unset", Value: bson.M{"d": ""}}},
		bson.M{"$currentDate": bson.M{"at": bson.M{"$type": "date"}}},
		bson.M{"$set": bson.M{"version": 1}},
		bson.M{"$set": bson.M{"_mc.w.x": 1}},
		bson.M{"$rename": bson.M{"a": "b"}},
		bson.M{"$set": bson.M{"l": bson.A{bson.M{"$gt": 1}}}},
		bson.M{"n": 1},
	} {
		raw, err := bson.Marshal(d)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
}

// FuzzCheckOps: whatever update document Guarded is given, checkOps does
// not panic, and an update it accepts uses only the allowed operators, never
// touches the id, the version or the write ids, and merges with the
// repository's own operators into an update that encodes.
func FuzzCheckOps(f *testing.F) {
	seedDocs(f)
	r := fuzzRepo(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		if bson.Raw(data).Validate() != nil {
			return
		}
		if err := r.checkOps("guarded", bson.Raw(data)); err != nil {
			return
		}
		ops := opsOf(bson.Raw(data))
		upd, err := r.updateOps("guarded", bson.Raw(data), nil)
		if err != nil {
			if wellFormed(data) {
				t.Fatalf("updateOps refused a well-formed update checkOps accepts: %v", err)
			}
			return // malformed deeper than checkOps looks
		}
		var given map[string]bson.Raw
		if err := bson.Unmarshal(upd, &given); err != nil {
			t.Fatalf("checked update does not decode: %v", err)
		}
		for _, o := range ops {
			switch o.Key {
			case "$set", "$unset", "$inc", "$currentDate":
			default:
				t.Fatalf("accepted operator %q", o.Key)
			}
			fields, _ := o.Value.(bson.D)
			for _, fe := range fields {
				root, _, _ := strings.Cut(fe.Key, ".")
				if root == "_id" || root == "version" || root == "_mc" || root == "_lease" {
					t.Fatalf("accepted path %q", fe.Key)
				}
				for seg := range strings.SplitSeq(fe.Key, ".") {
					if seg == "" || strings.HasPrefix(seg, "$") {
						t.Fatalf("accepted path %q", fe.Key)
					}
				}
			}
		}
		const wid = -77
		merged := r.guardedWrite(upd, wid, bson.E{})
		if err := merged.Validate(); err != nil {
			t.Fatalf("merged update is not valid BSON: %v", err)
		}
		var m map[string]bson.Raw
		if err := bson.Unmarshal(merged, &m); err != nil {
			t.Fatalf("merged update does not decode: %v", err)
		}
		if len(m) != len(given)+1+boolInt(given["$inc"] == nil) {
			t.Fatalf("merged update has operators %v from %v", m, given)
		}
		if v, ok := m["$inc"].Lookup("version").Int64OK(); !ok || v != 1 {
			t.Fatalf("merged update does not raise the version: %v", merged)
		}
		if w, _ := m["$push"].Lookup("_mc.ids", "$each", "0").Int64OK(); w != wid {
			t.Fatalf("merged update does not push the write id: %v", merged)
		}
		rec, _ := r.recordIDs(meta{}, wid)
		pinned := r.guardedWrite(upd, wid, rec)
		if w, _ := pinned.Lookup("$set", "_mc.ids", "0").Int64OK(); w != wid || pinned.Lookup("$push").Type != 0 {
			t.Fatalf("pinned update does not set the list of write ids: %v", pinned)
		}
		rec, _ = r.recordIDs(meta{unfit: bson.RawValue{Type: bson.TypeNull}}, wid)
		renewed := r.guardedWrite(upd, wid, rec)
		if w, _ := renewed.Lookup("$set", "_mc", "ids", "0").Int64OK(); w != wid || renewed.Lookup("$push").Type != 0 {
			t.Fatalf("update of unfit metadata does not set it afresh: %v", renewed)
		}
		for name, fields := range given {
			elems, _ := fields.Elements()
			for _, fe := range elems {
				if _, err := m[name].LookupErr(fe.Key()); err != nil {
					t.Fatalf("merged update lost %s %s: %v", name, fe.Key(), merged)
				}
			}
		}
	})
}

// FuzzCheckKeys: on any BSON document checkKeys does not panic, and a
// document it accepts has no field name, at any depth, that starts with '$'
// or contains '.'.
func FuzzCheckKeys(f *testing.F) {
	seedDocs(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		if bson.Raw(data).Validate() != nil {
			return
		}
		if checkKeys("insert", bson.Raw(data), "") != nil {
			return
		}
		var walk func(bson.RawValue)
		walk = func(v bson.RawValue) {
			switch v.Type {
			case bson.TypeEmbeddedDocument:
				elems, _ := v.Document().Elements()
				for _, e := range elems {
					if strings.HasPrefix(e.Key(), "$") || strings.Contains(e.Key(), ".") {
						t.Fatalf("accepted key %q", e.Key())
					}
					walk(e.Value())
				}
			case bson.TypeArray:
				vals, _ := v.Array().Values()
				for _, x := range vals {
					walk(x)
				}
			default:
			}
		}
		walk(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: data})
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestCheckOpsAllocatesNothingOnAGoodUpdate: Guarded's checks of an update
// it accepts allocate nothing, long top-level names included (a conversion
// of a name over 32 bytes to a string would allocate); a refused one says
// which path and why.
func TestCheckOpsAllocatesNothingOnAGoodUpdate(t *testing.T) {
	r := fuzzRepo(t)
	long := strings.Repeat("f", 40)
	good, err := bson.Marshal(bson.D{
		{Key: "$inc", Value: bson.D{{Key: "stock", Value: -1}}},
		{Key: "$set", Value: bson.D{{Key: long + ".x", Value: bson.D{{Key: "y", Value: 1}}}, {Key: "a.b", Value: bson.A{"s"}}}},
		{Key: "$currentDate", Value: bson.D{{Key: "at", Value: true}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := r.checkOps("guarded", good); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("checkOps allocated %v times on a good update", n)
	}
	bad, err := bson.Marshal(bson.D{{Key: "$set", Value: bson.D{{Key: "_lease.owner", Value: "x"}}}})
	if err != nil {
		t.Fatal(err)
	}
	var ie *InvalidError
	if err := r.checkOps("guarded", bad); !errors.As(err, &ie) || ie.Field != "_lease.owner" {
		t.Fatalf("a reserved path: got %v, want an *InvalidError at _lease.owner", err)
	}
}

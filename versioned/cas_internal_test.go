package versioned

import (
	"bytes"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/internal/settle"
)

// stateWith returns a document at version ver carrying the given write ids.
func stateWith(t *testing.T, ver, inc int64, ids ...int64) *docState {
	t.Helper()
	a := make(bson.A, 0, len(ids))
	for _, id := range ids {
		a = append(a, id)
	}
	raw, err := bson.Marshal(bson.D{{Key: "_mc", Value: bson.D{{Key: "inc", Value: inc}, {Key: "ids", Value: a}}}})
	if err != nil {
		t.Fatal(err)
	}
	arr, _ := bson.Raw(raw).Lookup("_mc", "ids").ArrayOK()
	return &docState{raw: raw, version: ver, meta: meta{inc: inc, ids: arr}}
}

func idsOf(t *testing.T, v bson.RawValue) []int64 {
	t.Helper()
	vals, err := v.Array().Values()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, len(vals))
	for i, x := range vals {
		out[i] = x.Int64()
	}
	return out
}

// TestExactIDs: a write appending k ids keeps the last WriteIDs-k ids read,
// so the list never holds more than WriteIDs.
func TestExactIDs(t *testing.T) {
	read := make([]int64, 0, WriteIDs)
	for i := range WriteIDs {
		read = append(read, int64(1000+i))
	}
	for _, tc := range []struct{ have, k int }{{0, 1}, {3, 2}, {WriteIDs - 1, 1}, {WriteIDs, 1}, {WriteIDs, maxBatch}, {5, maxBatch}} {
		st := stateWith(t, 10, 1, read[:tc.have]...)
		wids := make([]int64, 0, tc.k)
		for j := range tc.k {
			wids = append(wids, int64(-1-j))
		}
		got := idsOf(t, exactIDs(st.ids, wids...))
		keep := min(tc.have, WriteIDs-tc.k)
		want := append(append([]int64{}, read[tc.have-keep:tc.have]...), wids...)
		if len(got) != len(want) {
			t.Fatalf("have %d, k %d: got %d ids %v, want %v", tc.have, tc.k, len(got), got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("have %d, k %d: got %v, want %v", tc.have, tc.k, got, want)
			}
		}
	}
}

// TestJudgeSpan: a combined write of k changes against version b, whose last
// id is w, judged from a re-read.
func TestJudgeSpan(t *testing.T) {
	const b, k = 100, 3
	const inc, w1, w2, w3, y1, y2 = 7, 31, 32, 33, 41, 42
	w := &write{wid: w3, base: b}
	judge := judgeSpan(w, inc, true, k)
	full := func(ver int64, last ...int64) *docState {
		ids := make([]int64, 0, 8)
		for i := range 8 - len(last) {
			ids = append(ids, int64(50+i))
		}
		return stateWith(t, ver, inc, append(ids, last...)...)
	}
	for _, tc := range []struct {
		name string
		st   *docState
		want settle.Verdict
	}{
		{"gone", nil, settle.Unknown},
		{"landed", full(b+k, w1, w2, w3), settle.Landed},
		{"landed, then more writes", full(b+k+2, w1, w2, w3, y1, y2), settle.Landed},
		{"other incarnation", stateWith(t, b, inc+1), settle.Unknown},
		{"not yet", full(b), settle.Live},
		{"another write won", full(b + 1), settle.Dead},
		{"another write won, k-1 later", full(b + k - 1), settle.Dead},
		// Had it landed, w3 (version b+k) would be among the last 8 ids
		// while the version is at most b+k-1+8.
		{"still covered", full(b + k - 1 + 8), settle.Dead},
		{"too far", full(b + k + 8), settle.Unknown},
		{"behind", full(b - 1), settle.Unknown},
	} {
		if got, _ := judge(tc.st); got != tc.want {
			t.Errorf("%s: got verdict %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestPushIDEncoding: the $push document built by hand is the one the
// driver marshals.
func TestPushIDEncoding(t *testing.T) {
	for _, path := range []string{"_mc.ids", "meta.ids"} {
		want, err := bson.Marshal(bson.D{{Key: path, Value: bson.D{
			{Key: "$each", Value: bson.A{int64(-5)}},
			{Key: "$slice", Value: int32(-WriteIDs)},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := pushID(path, -5); !bytes.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, bson.Raw(want))
		}
	}
	if metaPath("meta", metaIDs) != "meta.ids" || metaPath(DefaultMetaField, metaInc) != "_mc.inc" {
		t.Fatal("metaPath")
	}
}

// TestAnchorAndWithMetaEncoding: the filter clause and the inserted
// metadata built by hand are the ones the driver marshals.
func TestAnchorAndWithMetaEncoding(t *testing.T) {
	want, err := bson.Marshal(bson.D{{Key: "$eq", Value: int64(3)}, {Key: "$ne", Value: int64(-9)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := anchorClause(3, -9); !bytes.Equal(got, want) {
		t.Fatalf("anchor: got %v, want %v", got, bson.Raw(want))
	}
	doc, err := bson.Marshal(bson.D{{Key: "_id", Value: "x"}, {Key: "n", Value: int64(1)}})
	if err != nil {
		t.Fatal(err)
	}
	want, err = bson.Marshal(bson.D{{Key: "_id", Value: "x"}, {Key: "n", Value: int64(1)}, {Key: "_mc", Value: bson.D{
		{Key: metaInc, Value: int64(-9)}, {Key: metaIDs, Value: bson.A{int64(-9)}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := withMeta(doc, "_mc", -9); !bytes.Equal(got, want) {
		t.Fatalf("withMeta: got %v, want %v", got, bson.Raw(want))
	}
}

// TestCASPipelineEncoding: the pipeline built as bytes is the one the
// driver would marshal from documents of $cond expressions.
func TestCASPipelineEncoding(t *testing.T) {
	repo := &Repo[struct{}]{opts: Options{VersionField: "version", MetaField: "_mc"}, incPath: "_mc.inc", idsPath: "_mc.ids"}
	ids := exactIDs(nil, 5, 6)
	for _, read := range []*docState{{version: 41, meta: meta{inc: -3}}, {version: 0}} {
		set := bson.D{{Key: "balance", Value: bson.RawValue{Type: bson.TypeInt64, Value: []byte{7, 0, 0, 0, 0, 0, 0, 0}}}, {Key: "version", Value: read.version + 2}, {Key: "_mc.ids", Value: ids}}
		unset := bson.D{{Key: "note", Value: ""}}
		ver := bson.D{{Key: "$eq", Value: bson.A{bson.D{{Key: "$ifNull", Value: bson.A{"$version", int64(0)}}}, read.version}}}
		inc := bson.D{{Key: "$eq", Value: bson.A{bson.D{{Key: "$ifNull", Value: bson.A{"$_mc.inc", int64(0)}}}, read.inc}}}
		cond := bson.D{{Key: "$and", Value: bson.A{ver, inc}}}
		fields := bson.D{}
		for _, e := range set {
			fields = append(fields, bson.E{Key: e.Key, Value: bson.D{{Key: "$cond", Value: bson.A{cond, bson.D{{Key: "$literal", Value: e.Value}}, "$" + e.Key}}}})
		}
		fields = append(fields, bson.E{Key: "note", Value: bson.D{{Key: "$cond", Value: bson.A{cond, "$$REMOVE", "$note"}}}})
		_, want, err := bson.MarshalValue(bson.A{bson.D{{Key: "$set", Value: fields}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := repo.casPipeline(read, set, unset); !bytes.Equal(got, want) {
			t.Fatalf("version %d: got %v, want %v", read.version, bson.RawArray(got), bson.RawArray(want))
		}
	}
}

package shard_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/internal/shard"
	"github.com/mongocas/mongocas/store"
)

func noneOwned(string) string { return "" }

func mustParse(t *testing.T, fields ...string) shard.Spec {
	t.Helper()
	s, err := shard.Parse(fields, noneOwned)
	require.NoError(t, err)
	return s
}

func TestParse(t *testing.T) {
	for name, fields := range map[string][]string{
		"empty":          {""},
		"empty segment":  {"a..b"},
		"trailing dot":   {"a."},
		"dollar":         {"$where"},
		"dollar segment": {"a.$b"},
		"NUL":            {"a\x00b"},
		"twice":          {"a", "a"},
		"under another":  {"a", "a.b"},
		"above another":  {"a.b", "a"},
		"owned":          {"version"},
	} {
		_, err := shard.Parse(fields, func(root string) string {
			if root == "version" {
				return "is the version field"
			}
			return ""
		})
		require.Error(t, err, name)
	}
	s := mustParse(t, "_id", "region", "_id.x", "owner.accountId")
	require.True(t, s.Enabled())
	require.Equal(t, []string{"region", "owner.accountId"}, s.Paths(), "fields under _id add nothing")
	require.False(t, mustParse(t, "_id").Enabled(), "_id alone is no shard key to add")
	require.False(t, mustParse(t).Enabled())
}

func TestSplit(t *testing.T) {
	s := mustParse(t, "region", "accountId")
	bare, v, err := s.Split(store.Key{ID: "a-1", Shard: bson.D{{Key: "accountId", Value: 7}, {Key: "region", Value: "eu"}}})
	require.NoError(t, err)
	require.Equal(t, "a-1", bare)
	require.Equal(t, bson.D{
		{Key: "region", Value: bson.D{{Key: "$eq", Value: mustRaw(t, "eu")}}},
		{Key: "accountId", Value: bson.D{{Key: "$eq", Value: mustRaw(t, 7)}}},
	}, v.Clauses(), "in the Spec's order, whatever the Key's")

	for name, id := range map[string]any{
		"bare id":       "a-1",
		"pointer":       &store.Key{ID: "a-1"},
		"missing field": store.Key{ID: "a-1", Shard: bson.D{{Key: "region", Value: "eu"}}},
		"other field":   store.Key{ID: "a-1", Shard: bson.D{{Key: "region", Value: "eu"}, {Key: "accountId", Value: 7}, {Key: "zone", Value: 1}}},
		"twice":         store.Key{ID: "a-1", Shard: bson.D{{Key: "region", Value: "eu"}, {Key: "region", Value: "us"}, {Key: "accountId", Value: 7}}},
		"operator":      store.Key{ID: "a-1", Shard: bson.D{{Key: "region", Value: bson.D{{Key: "$ne", Value: ""}}}, {Key: "accountId", Value: 7}}},
		"null":          store.Key{ID: "a-1", Shard: bson.D{{Key: "region", Value: nil}, {Key: "accountId", Value: 7}}},
		"nested Key":    store.Key{ID: store.Key{ID: "a-1"}, Shard: bson.D{{Key: "region", Value: "eu"}, {Key: "accountId", Value: 7}}},
	} {
		_, _, err := s.Split(id)
		require.ErrorIs(t, err, store.ErrInvalidID, name)
	}

	none := mustParse(t)
	bare, v, err = none.Split("a-1")
	require.NoError(t, err)
	require.Equal(t, "a-1", bare)
	require.Nil(t, v.Clauses())
	bare, _, err = none.Split(store.Key{ID: "a-1"})
	require.NoError(t, err)
	require.Equal(t, "a-1", bare)
	_, _, err = none.Split(store.Key{ID: "a-1", Shard: bson.D{{Key: "region", Value: "eu"}}})
	require.ErrorIs(t, err, store.ErrInvalidID, "shard values without a shard key")
}

func TestFromDocAndDiffers(t *testing.T) {
	s := mustParse(t, "region", "owner.accountId")
	doc := mustDoc(t, bson.D{{Key: "_id", Value: "a-1"}, {Key: "region", Value: "eu"}, {Key: "owner", Value: bson.D{{Key: "accountId", Value: int32(7)}}}})
	v, err := s.FromDoc(doc, "a-1")
	require.NoError(t, err)
	k, err := splitKey(s, "eu", int64(7))
	require.NoError(t, err)
	require.Equal(t, k.Ident(), v.Ident(), "int32 7 and int64 7 are one value to $eq")

	for name, d := range map[string]bson.D{
		"missing":   {{Key: "region", Value: "eu"}},
		"not a doc": {{Key: "region", Value: "eu"}, {Key: "owner", Value: 1}},
		"null":      {{Key: "region", Value: nil}, {Key: "owner", Value: bson.D{{Key: "accountId", Value: 7}}}},
		"array":     {{Key: "region", Value: bson.A{"eu"}}, {Key: "owner", Value: bson.D{{Key: "accountId", Value: 7}}}},
	} {
		_, err := s.FromDoc(mustDoc(t, d), "a-1")
		require.ErrorIs(t, err, store.ErrInvalidID, name)
	}

	same := mustRaw(t, bson.D{{Key: "accountId", Value: 7.0}, {Key: "name", Value: "x"}})
	_, changed := v.Differs("owner", same, true)
	require.False(t, changed, "7.0 is 7")
	f, changed := v.Differs("owner", mustRaw(t, bson.D{{Key: "accountId", Value: 8}}), true)
	require.True(t, changed)
	require.Equal(t, "owner.accountId", f)
	_, changed = v.Differs("owner", mustRaw(t, "flat"), true)
	require.True(t, changed, "a shard-key path through a scalar is gone")
	_, changed = v.Differs("owner", bson.RawValue{}, false)
	require.True(t, changed, "removed")
	_, changed = v.Differs("region", mustRaw(t, "us"), true)
	require.True(t, changed)
	_, changed = v.Differs("region", mustRaw(t, "eu"), true)
	require.False(t, changed)
	_, changed = v.Differs("note", mustRaw(t, "x"), true)
	require.False(t, changed, "not a shard-key field")
}

func TestTouches(t *testing.T) {
	s := mustParse(t, "region", "owner.accountId")
	for _, p := range []string{"region", "region.x", "owner", "owner.accountId", "owner.accountId.low"} {
		_, ok := s.Touches(p)
		require.True(t, ok, p)
	}
	for _, p := range []string{"regions", "owner.name", "ownerX", "balance"} {
		_, ok := s.Touches(p)
		require.False(t, ok, p)
	}
}

func TestSame(t *testing.T) {
	require.True(t, shard.Same(mustRaw(t, int32(3)), mustRaw(t, int64(3))))
	require.True(t, shard.Same(mustRaw(t, 3.0), mustRaw(t, int64(3))))
	require.False(t, shard.Same(mustRaw(t, 3.5), mustRaw(t, int64(3))))
	require.False(t, shard.Same(mustRaw(t, "3"), mustRaw(t, int64(3))))
	require.True(t, shard.Same(mustRaw(t, 3.5), mustRaw(t, 3.5)))
}

func splitKey(s shard.Spec, region string, account int64) (shard.Values, error) {
	_, v, err := s.Split(store.Key{ID: "a-1", Shard: bson.D{{Key: "region", Value: region}, {Key: "owner.accountId", Value: account}}})
	return v, err
}

func mustRaw(t *testing.T, v any) bson.RawValue {
	t.Helper()
	typ, data, err := bson.MarshalValue(v)
	require.NoError(t, err)
	return bson.RawValue{Type: typ, Value: data}
}

func mustDoc(t *testing.T, d bson.D) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(d)
	require.NoError(t, err)
	return b
}

// FuzzSplit feeds a Key arbitrary BSON as its shard-key values: Split must
// never panic, and what it accepts must be plain values, compared with $eq.
func FuzzSplit(f *testing.F) {
	f.Add(mustDocF(f, bson.D{{Key: "region", Value: "eu"}, {Key: "accountId", Value: 7}}))
	f.Add(mustDocF(f, bson.D{{Key: "region", Value: bson.D{{Key: "$gt", Value: ""}}}, {Key: "accountId", Value: 7}}))
	f.Add(mustDocF(f, bson.D{{Key: "region", Value: bson.A{1}}, {Key: "accountId", Value: bson.Regex{Pattern: "."}}}))
	s, err := shard.Parse([]string{"region", "accountId"}, noneOwned)
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, data []byte) {
		elems, err := bson.Raw(data).Elements()
		if err != nil || bson.Raw(data).Validate() != nil {
			return
		}
		var d bson.D
		for _, e := range elems {
			d = append(d, bson.E{Key: e.Key(), Value: e.Value()})
		}
		_, v, err := s.Split(store.Key{ID: "a-1", Shard: d})
		if err != nil {
			require.ErrorIs(t, err, store.ErrInvalidID)
			return
		}
		for _, c := range v.Clauses() {
			eq, ok := c.Value.(bson.D)
			require.True(t, ok)
			require.Len(t, eq, 1)
			require.Equal(t, "$eq", eq[0].Key)
			raw, ok := eq[0].Value.(bson.RawValue)
			require.True(t, ok)
			_, err := store.CheckValue(raw)
			require.NoError(t, err)
		}
	})
}

func mustDocF(f *testing.F, d bson.D) []byte {
	f.Helper()
	b, err := bson.Marshal(d)
	require.NoError(f, err)
	return b
}

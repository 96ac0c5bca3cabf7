package store_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/store"
)

func TestCheckValueRefusesOperatorShapedValuesButNotZeroOnes(t *testing.T) {
	for name, v := range map[string]any{
		"nil":             nil,
		"missing raw":     bson.RawValue{},
		"null":            bson.Null{},
		"$gt map":         map[string]any{"$gt": ""},
		"nested $ key":    bson.D{{Key: "a", Value: bson.D{{Key: "$where", Value: "1"}}}},
		"regex":           bson.Regex{Pattern: ".*"},
		"javascript":      bson.JavaScript("return true"),
		"array":           bson.A{"eu"},
		"raw array":       bson.RawValue{Type: bson.TypeArray, Value: []byte{5, 0, 0, 0, 0}},
		"min key":         bson.MinKey{},
		"unencodable":     make(chan int),
		"raw null":        bson.RawValue{Type: bson.TypeNull},
		"empty-key doc":   bson.D{{Key: "", Value: 1}},
		"$ key in a list": bson.D{{Key: "a", Value: bson.A{bson.D{{Key: "$ne", Value: 1}}}}},
	} {
		_, err := store.CheckValue(v)
		require.ErrorIs(t, err, store.ErrInvalidID, name)
		require.ErrorIs(t, err, store.ErrInvalid, name)
		require.NotContains(t, err.Error(), ": id ", name)
	}
	for name, v := range map[string]any{
		"zero int":     0,
		"empty string": "",
		"int64":        int64(7),
		"string":       "eu",
		"document":     bson.D{{Key: "zone", Value: "a"}},
		"raw string":   bson.RawValue{Type: bson.TypeString, Value: []byte{3, 0, 0, 0, 'e', 'u', 0}},
	} {
		raw, err := store.CheckValue(v)
		require.NoError(t, err, name)
		require.NotZero(t, raw.Type, name)
	}
}

func TestKeyString(t *testing.T) {
	require.Equal(t, "a-1", store.Key{ID: "a-1"}.String())
	require.Equal(t, "a-1 (region=eu, accountId=7)", store.Key{ID: "a-1", Shard: bson.D{{Key: "region", Value: "eu"}, {Key: "accountId", Value: 7}}}.String())
}

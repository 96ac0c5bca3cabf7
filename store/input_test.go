package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/store"
)

func TestCheckIDRefusesOperatorShapedAndZeroIDs(t *testing.T) {
	var nilMap map[string]any
	var nilPtr *int
	type key struct {
		Tenant string `bson:"tenant"`
		N      int    `bson:"n"`
	}
	for name, id := range map[string]any{
		"nil":                nil,
		"nil map":            nilMap,
		"nil pointer":        nilPtr,
		"empty string":       "",
		"zero int":           0,
		"zero ObjectID":      bson.ObjectID{},
		"zero struct":        key{},
		"$gt map":            map[string]any{"$gt": ""},
		"$ne null (JSON)":    map[string]any{"$ne": nil},
		"$regex bson.D":      bson.D{{Key: "$regex", Value: "^partner-api:"}},
		"nested $ key":       bson.D{{Key: "a", Value: bson.D{{Key: "$where", Value: "1"}}}},
		"$ key in array":     bson.D{{Key: "a", Value: bson.A{bson.D{{Key: "$gt", Value: 1}}}}},
		"empty key":          bson.D{{Key: "", Value: 1}},
		"regex":              bson.Regex{Pattern: ".*", Options: ""},
		"regex nested":       bson.D{{Key: "a", Value: bson.Regex{Pattern: ".*"}}},
		"javascript":         bson.JavaScript("return true"),
		"code with scope":    bson.CodeWithScope{Code: "x", Scope: bson.D{{Key: "x", Value: 1}}},
		"array":              bson.A{"a", "b"},
		"slice":              []string{"a"},
		"null nested":        bson.D{{Key: "a", Value: nil}},
		"minkey":             bson.MinKey{},
		"maxkey":             bson.MaxKey{},
		"undefined":          bson.Undefined{},
		"unencodable (chan)": make(chan int),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := store.CheckID(id)
			require.Error(t, err)
			require.ErrorIs(t, err, store.ErrInvalidID)
			require.ErrorIs(t, err, store.ErrInvalid)
			var ie *store.IDError
			require.ErrorAs(t, err, &ie)
			require.NotEmpty(t, ie.Reason)
		})
	}
}

func TestCheckIDAcceptsPlainValues(t *testing.T) {
	type key struct {
		Tenant string `bson:"tenant"`
		N      int    `bson:"n"`
	}
	for name, id := range map[string]any{
		"string":             "alice",
		"string with $":      "$ne",
		"string with NUL":    "a\x00b",
		"unicode string":     "héllo",
		"int":                42,
		"negative int64":     int64(-7),
		"ObjectID":           bson.NewObjectID(),
		"struct":             key{Tenant: "t", N: 1},
		"document":           bson.D{{Key: "tenant", Value: "t"}, {Key: "n", Value: 1}},
		"document with dots": bson.D{{Key: "a.b", Value: 1}},
	} {
		t.Run(name, func(t *testing.T) {
			raw, err := store.CheckID(id)
			require.NoError(t, err)
			require.NotZero(t, raw.Type)
			f := store.IDFilter(raw)
			require.Len(t, f, 1)
			require.Equal(t, "_id", f[0].Key)
			if raw.Type == bson.TypeString || raw.Type == bson.TypeObjectID {
				// No server reads a string or an ObjectID as an operator.
				require.Equal(t, raw, f[0].Value)
			} else {
				require.Equal(t, bson.D{{Key: "$eq", Value: raw}}, f[0].Value, "the $eq keeps a document a value")
			}
			// Encoded as the driver encodes it (strings and ObjectIDs take
			// a path of their own).
			typ, data, err := bson.MarshalValue(id)
			require.NoError(t, err)
			require.Equal(t, typ, raw.Type)
			require.Equal(t, data, raw.Value)
		})
	}
}

func TestCheckContext(t *testing.T) {
	//nolint:staticcheck // a nil context is the input under test
	require.ErrorIs(t, store.CheckContext(nil), store.ErrInvalid)
	require.NoError(t, store.CheckContext(context.Background()))
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("client went away")
	cancel(cause)
	err := store.CheckContext(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, cause)
	require.NotErrorIs(t, err, store.ErrInvalid)
}

func TestIsAmbiguousWriteConcernAndLabels(t *testing.T) {
	wce := mongo.WriteException{WriteConcernError: &mongo.WriteConcernError{Code: 64, Name: "WriteConcernFailed"}}
	require.True(t, store.IsAmbiguous(wce))
	require.True(t, store.HasWriteConcernError(wce))
	require.True(t, store.IsAmbiguous(errors.Join(errors.New("wrapped"), wce)))
	labelled := mongo.CommandError{Code: 10107, Name: "NotWritablePrimary", Labels: []string{store.LabelRetryableWrite}}
	require.True(t, store.IsAmbiguous(labelled))
	dup := mongo.WriteException{WriteErrors: mongo.WriteErrors{{Code: 11000, Message: "E11000 duplicate key"}}}
	require.False(t, store.IsAmbiguous(dup), "a write error the server returned was not applied")
	dupAndWCE := mongo.WriteException{
		WriteErrors:       mongo.WriteErrors{{Code: 11000, Message: "E11000 duplicate key"}},
		WriteConcernError: &mongo.WriteConcernError{Code: 64, Name: "WriteConcernFailed"},
	}
	require.False(t, store.IsAmbiguous(dupAndWCE), "a write error wins over a writeConcernError: the write was not applied")
	require.False(t, store.IsAmbiguous(nil))
}

package versioned_test

// Query-operator injection through the id. The package doc says: "a field
// name (at any depth, map keys included) that starts with '$' ... is
// ErrInvalid, refused before anything is sent". That holds for ids too: an
// id of interface type (`ID any`, common for models whose ids are ObjectIDs
// or strings) that is operator-shaped is refused by Get, Delete, Modify and
// Guarded rather than put into the filter as {_id: <value>}.

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/versioned"
)

type anyID struct {
	ID      any    `bson:"_id"`
	Owner   string `bson:"owner"`
	Secret  string `bson:"secret"`
	Version int64  `bson:"version"`
}

func injectedID(t *testing.T, body string) any {
	t.Helper()
	var req struct {
		ID any `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &req))
	return req.ID // map[string]interface{}{"$ne": ...}
}

// An id decoded from a request body such as {"id": {"$ne": null}} (an
// `ID any` field gets a map[string]any) is refused by Get before anything
// is sent: it never selects another user's document.
func TestOperatorIDGetReadsNoOtherDocument(t *testing.T) {
	repo, b := setup[anyID](t, nil)
	ctx := context.Background()
	require.NoError(t, repo.Insert(ctx, &anyID{ID: "alice", Owner: "alice", Secret: "alice's secret"}))

	got, err := repo.Get(ctx, injectedID(t, `{"id": {"$ne": "mallory"}}`))
	if err == nil {
		t.Logf("Get returned %+v", *got)
	}
	require.ErrorIs(t, err, versioned.ErrInvalid, "BUG: an id with a '$' key was sent as a query operator")
	_ = b
}

// The same for Delete: alice's document stays.
func TestOperatorIDDeleteRemovesNoOtherDocument(t *testing.T) {
	repo, b := setup[anyID](t, nil)
	ctx := context.Background()
	require.NoError(t, repo.Insert(ctx, &anyID{ID: "alice", Owner: "alice"}))

	err := repo.Delete(ctx, &anyID{ID: injectedID(t, `{"id": {"$ne": "mallory"}}`), Version: 1})
	t.Logf("Delete: %v; documents left: %d", err, b.count(t))
	require.Equal(t, int64(1), b.count(t), "BUG: Delete of id {$ne: mallory} removed alice")
}

// The same for Guarded: alice's document is not rewritten.
func TestOperatorIDGuardedWritesNoOtherDocument(t *testing.T) {
	repo, b := setup[anyID](t, nil)
	ctx := context.Background()
	require.NoError(t, repo.Insert(ctx, &anyID{ID: "alice", Owner: "alice"}))

	_, err := repo.Guarded(ctx, injectedID(t, `{"id": {"$gt": ""}}`), nil,
		bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: "mallory"}}}})
	t.Logf("Guarded: %v", err)
	require.Equal(t, "alice", b.raw(t, "alice")["owner"], "BUG: Guarded on id {$gt: \"\"} rewrote alice's document")
}

// Operator-shaped ids match ErrInvalidID as well as ErrInvalid.
func TestOperatorIDIsInvalidID(t *testing.T) {
	t.Parallel()
	repo, b := setup[anyID](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &anyID{ID: "alice", Owner: "alice"}))
	for _, id := range []any{
		map[string]any{"$ne": nil},
		bson.M{"$gt": ""},
		bson.Regex{Pattern: "^a"},
		bson.JavaScript("1"),
		bson.A{"alice"},
		bson.D{{Key: "x", Value: bson.D{{Key: "$exists", Value: true}}}},
	} {
		_, err := repo.Get(b.ctx, id)
		require.ErrorIs(t, err, versioned.ErrInvalidID, "%#v", id)
		require.ErrorIs(t, err, versioned.ErrInvalid, "%#v", id)
		require.True(t, strings.HasPrefix(err.Error(), "versioned: get: invalid id"), err.Error())
	}
	// A document id that is a plain document works, compared by $eq.
	require.NoError(t, repo.Insert(b.ctx, &anyID{ID: bson.D{{Key: "tenant", Value: "t"}, {Key: "n", Value: int32(1)}}, Owner: "t"}))
	got, err := repo.Get(b.ctx, bson.D{{Key: "tenant", Value: "t"}, {Key: "n", Value: int32(1)}})
	require.NoError(t, err)
	require.Equal(t, "t", got.Owner)
}

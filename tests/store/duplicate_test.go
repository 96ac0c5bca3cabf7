package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

// TestIsDuplicateKeyDocumentDBForm: DocumentDB's InternalError for a
// duplicate key inside findAndModify is recognised, and only that exact form.
func TestIsDuplicateKeyDocumentDBForm(t *testing.T) {
	internal := func(msg string) mongo.CommandError {
		return mongo.CommandError{Code: 1, Name: "InternalError", Message: msg}
	}
	const pk = `duplicate key value violates unique constraint "collection_pk_204"`
	const excl = `conflicting key value violates exclusion constraint "documents_rum_index_207"`
	for _, err := range []error{
		internal(pk),
		internal(excl),
		fmt.Errorf("versioned: guarded a2: %w", internal(excl)),
		errors.Join(errors.New("other"), internal(pk)),
		mongo.CommandError{Code: 11000, Name: "DuplicateKey", Message: "E11000 duplicate key error"},
		mongo.WriteException{WriteErrors: mongo.WriteErrors{{Code: 11000, Message: "E11000 duplicate key"}}},
	} {
		require.True(t, store.IsDuplicateKey(err), "%#v", err)
	}
	for _, err := range []error{
		nil,
		internal("could not serialize access due to concurrent update"),
		internal("ERROR: " + pk),                                   // the prefix, not anywhere in the text
		internal("duplicate key value violates unique constraint"), // no constraint named
		mongo.CommandError{Code: 2, Name: "InternalError", Message: pk},
		mongo.CommandError{Code: 1, Name: "BadValue", Message: pk},
		mongo.CommandError{Code: 1, Message: pk},
		errors.New(pk), // text alone is never enough
		mongo.WriteException{WriteErrors: mongo.WriteErrors{{Code: 1, Message: pk}}},
	} {
		require.False(t, store.IsDuplicateKey(err), "%#v", err)
	}
	require.False(t, store.IsTransient(internal(pk)))
	require.False(t, store.IsAmbiguous(internal(pk)))
}

// TestDuplicateKeyInFindAndModifyRace: racers upsert the same document with
// findOneAndUpdate, by _id and by a unique secondary index. Exactly one wins
// each round and every loser's error is a duplicate key. On FerretDB v2 the
// losers see DocumentDB's InternalError form, which IsDuplicateKey must
// recognise. There, racers on a unique secondary index (an exclusion
// constraint in PostgreSQL) are also sometimes aborted by PostgreSQL's
// deadlock detector: not a duplicate key, not applied, and counted apart.
func TestDuplicateKeyInFindAndModifyRace(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	const racers = 8
	// Fewer rounds on the secondary index: each deadlock there costs
	// PostgreSQL's deadlock_timeout (1 s) to detect.
	for by, rounds := range map[string]int{"_id": 20, "name": 8} {
		coll := db.Collection("locks_by" + by)
		if by != "_id" {
			_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: by, Value: 1}}, Options: options.Index().SetUnique(true)})
			require.NoError(t, err)
		}
		var dups, internal, deadlocks int
		for round := range rounds {
			key := fmt.Sprintf("%s-%d", by, round)
			var (
				mu      sync.Mutex
				winners int
				others  []error
				wg      sync.WaitGroup
			)
			gate := make(chan struct{})
			for r := range racers {
				wg.Go(func() {
					<-gate
					err := coll.FindOneAndUpdate(ctx,
						bson.D{{Key: by, Value: key}, {Key: "owner", Value: nil}},
						bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: r}}}},
						options.FindOneAndUpdate().SetUpsert(true)).Err()
					mu.Lock()
					defer mu.Unlock()
					switch {
					case errors.Is(err, mongo.ErrNoDocuments):
						winners++ // upserted: no document before
					case db.Caps().Server == store.FerretDBv2 && store.IsWriteConflict(err):
						deadlocks++
					case store.IsDuplicateKey(err):
						dups++
						var ce mongo.CommandError
						if errors.As(err, &ce) && ce.Code == 1 {
							internal++
						}
					default:
						others = append(others, err)
					}
				})
			}
			close(gate)
			wg.Wait()
			require.Empty(t, others, "round %d by %s: every loser must see a duplicate key", round, by)
			require.Equal(t, 1, winners, "round %d by %s: exactly one upsert wins", round, by)
			n, err := coll.CountDocuments(ctx, bson.D{{Key: by, Value: key}})
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
		}
		t.Logf("%s by %s: %d duplicate-key losers, %d of them InternalError code 1; %d deadlocks",
			db.Caps().Server, by, dups, internal, deadlocks)
		require.Equal(t, (racers-1)*rounds, dups+deadlocks, "every loser saw a duplicate key (or, on FerretDB v2, a deadlock)")
		require.Positive(t, dups)
		if db.Caps().Server == store.FerretDBv2 {
			require.Equal(t, dups, internal, "DocumentDB answers a duplicate key in findAndModify with InternalError code 1")
		}
	}
}

// TestDocumentDBDeadlockIsAWriteConflict: PostgreSQL's deadlock_detected, as
// DocumentDB passes it through, is a write conflict (retry it) and not
// ambiguous (it was not applied); nothing else with its code or its text is.
func TestDocumentDBDeadlockIsAWriteConflict(t *testing.T) {
	for _, err := range []error{
		mongo.CommandError{Code: 1, Name: "InternalError", Message: "deadlock detected"},
		fmt.Errorf("wrapped: %w", mongo.CommandError{Code: 1, Name: "InternalError", Message: "deadlock detected"}),
	} {
		require.True(t, store.IsWriteConflict(err), "%v", err)
		require.True(t, store.IsTransient(err), "%v", err)
		require.False(t, store.IsAmbiguous(err), "%v", err)
		require.False(t, store.IsDuplicateKey(err), "%v", err)
	}
	for _, err := range []error{
		mongo.CommandError{Code: 1, Name: "InternalError", Message: "something else: deadlock detected"},
		mongo.CommandError{Code: 2, Name: "InternalError", Message: "deadlock detected"},
		mongo.CommandError{Code: 1, Name: "BadValue", Message: "deadlock detected"},
		errors.New("deadlock detected"),
		mongo.WriteException{WriteErrors: mongo.WriteErrors{{Code: 1, Message: "deadlock detected"}}},
	} {
		require.False(t, store.IsWriteConflict(err), "%v", err)
	}
}

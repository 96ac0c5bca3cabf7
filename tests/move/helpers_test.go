package move_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/tests/internal/queuetest"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(moverChild(spec)) // TestMovesOfAKilledProcessSettle's child
	}
	mongotest.Main(m, mongotest.CheckLeaks())
}

// account is the document moves move value between.
type account struct {
	ID      string `bson:"_id"`
	Balance int64  `bson:"balance"`
	Closed  bool   `bson:"closed,omitempty"`
	Version int64  `bson:"version"`
}

type bundle struct {
	db       *mongotest.DB
	accounts *versioned.Repo[account]
	ctx      context.Context
}

func setup(t testing.TB) *bundle {
	t.Helper()
	db := mongotest.New(t)
	accounts, err := versioned.New[account](db.Collection("accounts"), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return &bundle{db: db, accounts: accounts, ctx: ctx}
}

// queue returns a Queue on the jobs collection of db (the test's own, or a
// Faulty one), with fast polls and backoffs.
func (b *bundle) queue(t testing.TB, db *mongo.Database) *deferred.Queue {
	t.Helper()
	return b.queueWith(t, db, 1000)
}

// queueOnce returns a Queue on the test's jobs collection that gives a job
// one attempt: a relay that fails once dies, and leaves its move to Sweep.
func (b *bundle) queueOnce(t testing.TB) *deferred.Queue {
	t.Helper()
	return b.queueWith(t, nil, 1)
}

// queueWith returns a Queue on the jobs collection of db (nil: the test's
// own), with fast polls and backoffs, that tries a job maxAttempts times.
func (b *bundle) queueWith(t testing.TB, db *mongo.Database, maxAttempts int) *deferred.Queue {
	t.Helper()
	if db == nil {
		db = b.db.Database
	}
	q, err := deferred.New(db.Collection("jobs"), &deferred.Options{
		PollInterval: 50 * time.Millisecond,
		HoleTimeout:  500 * time.Millisecond,
		Backoff:      retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		MaxAttempts:  maxAttempts,
	})
	require.NoError(t, err)
	return q
}

// mover returns a Mover of the accounts collection of db through q.
func (b *bundle) mover(t testing.TB, q *deferred.Queue, db *mongo.Database, opts *move.Options) *move.Mover {
	t.Helper()
	if db == nil {
		db = b.db.Database
	}
	o := move.Options{Field: "balance", Grace: time.Nanosecond, Outcomes: b.db.Collection("accounts_moves")}
	if opts != nil {
		o = *opts
	}
	m, err := move.New(b.ctx, q, db.Collection("accounts"), &o)
	require.NoError(t, err)
	return m
}

// observer returns a Mover on the test's own client, for Status and Sum
// while the movers under test go through a fault proxy (whose faults close
// their client's connections). Its queue is never run.
func (b *bundle) observer(t testing.TB) *move.Mover {
	t.Helper()
	return b.mover(t, b.queue(t, nil), nil, nil)
}

func (b *bundle) insert(t testing.TB, id string, balance int64) {
	t.Helper()
	require.NoError(t, b.accounts.Insert(b.ctx, &account{ID: id, Balance: balance}))
}

func (b *bundle) balance(t testing.TB, id string) int64 {
	t.Helper()
	a, err := b.accounts.Get(b.ctx, id)
	require.NoError(t, err)
	return a.Balance
}

// requireBalances requires each account of want to hold its balance.
func (b *bundle) requireBalances(t testing.TB, want map[string]int64) {
	t.Helper()
	for id, v := range want {
		require.Equal(t, v, b.balance(t, id), id)
	}
}

// threeMovesToBen inserts ana (100) and ben (0) and moves 10 from ana to
// ben three times through m, returning the moves' ids.
func (b *bundle) threeMovesToBen(t testing.TB, m *move.Mover) []bson.ObjectID {
	t.Helper()
	b.insert(t, "ana", 100)
	b.insert(t, "ben", 0)
	ids := make([]bson.ObjectID, 0, 3)
	for range 3 {
		id, err := m.Move(b.ctx, "ana", "ben", 10, nil)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

// run starts q.Run and returns a function that stops it and waits.
func run(t testing.TB, q *deferred.Queue) (stop func()) {
	t.Helper()
	return queuetest.Run(t, q)
}

// waitStatus waits until the move id from "ana" (most tests' source) is
// settled and returns its status.
func waitStatus(t testing.TB, m *move.Mover, id bson.ObjectID) move.Status {
	t.Helper()
	return waitStatusFrom(t, m, "ana", id)
}

// waitStatusFrom waits until the move id from the source from is settled
// and returns its status.
func waitStatusFrom(t testing.TB, m *move.Mover, from any, id bson.ObjectID) move.Status {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := m.Status(context.Background(), from, id)
		require.NoError(t, err)
		if st != move.Pending {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("move %s still pending after 2 minutes", id.Hex())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// requireNoMoveState requires that no document of the collection carries
// move state: every pending entry, outcome and marker is gone.
func (b *bundle) requireNoMoveState(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		n, err := b.db.Collection("accounts").CountDocuments(b.ctx, bson.D{{Key: "_mv.n", Value: bson.D{{Key: "$ne", Value: 0}}}, {Key: "_mv", Value: bson.D{{Key: "$exists", Value: true}}}})
		require.NoError(t, err)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d documents still carry move state", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var docs []bson.M
	cur, err := b.db.Collection("accounts").Find(b.ctx, bson.D{})
	require.NoError(t, err)
	require.NoError(t, cur.All(b.ctx, &docs))
	for _, d := range docs {
		mv, ok := d["_mv"].(bson.M)
		if !ok {
			continue
		}
		for _, part := range []string{"o", "i", "d"} {
			if e, ok := mv[part].(bson.M); ok {
				require.Empty(t, e, "document %v still has %s entries", d["_id"], part)
			}
		}
	}
}

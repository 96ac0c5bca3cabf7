package deferred_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/tests/internal/queuetest"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

// account is the target document of most tests: a balance, the count of
// changes applied to it, and the index of the last one (per-key order).
type account struct {
	ID      string `bson:"_id"`
	Balance int64  `bson:"balance"`
	Applied int64  `bson:"applied"`
	Last    int64  `bson:"last"`
	Version int64  `bson:"version"`
}

// credit is the argument of the test handlers: the amount, and the index
// of the job among its key's jobs, from 1, in enqueue order.
type credit struct {
	Amount int64 `bson:"amount"`
	Index  int64 `bson:"index"`
}

// fast are Options that poll, back off and give up on holes quickly, for
// tests.
func fast(opts *deferred.Options) *deferred.Options {
	if opts == nil {
		opts = &deferred.Options{}
	}
	o := *opts
	if o.Observer == nil && os.Getenv("DEFERRED_LOG") != "" {
		o.Observer = observe.Slog(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	}
	o.PollInterval = or(o.PollInterval, 100*time.Millisecond)
	o.HoleTimeout = or(o.HoleTimeout, 500*time.Millisecond)
	if o.Backoff.InitialInterval == 0 && o.Backoff.MaxInterval == 0 {
		o.Backoff = retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 50 * time.Millisecond}
	}
	return &o
}

func or[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

type bundle struct {
	db       *mongotest.DB
	accounts *versioned.Repo[account]
	jobs     *mongo.Collection
	ctx      context.Context
}

func setup(t testing.TB) *bundle {
	t.Helper()
	db := mongotest.New(t)
	accounts, err := versioned.New[account](db.Collection("accounts"), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return &bundle{db: db, accounts: accounts, jobs: db.Collection("jobs"), ctx: ctx}
}

// queue returns a Queue on the bundle's jobs collection reached through db
// (the shared client, or a Faulty one).
func (b *bundle) queue(t testing.TB, db *mongo.Database, opts *deferred.Options) *deferred.Queue {
	t.Helper()
	if db == nil {
		db = b.db.Database
	}
	q, err := deferred.New(db.Collection(b.jobs.Name()), fast(opts))
	require.NoError(t, err)
	return q
}

func (b *bundle) insert(t testing.TB, ids ...string) {
	t.Helper()
	for _, id := range ids {
		require.NoError(t, b.accounts.Insert(b.ctx, &account{ID: id}))
	}
}

// enqueuer is a Kind or a Change: what enqueues an A on a key.
type enqueuer[A any] interface {
	Enqueue(ctx context.Context, key any, args A) (bson.ObjectID, error)
}

// enqueue enqueues args on key through k and returns the job's id; the
// enqueue must succeed.
func enqueue[A any](t testing.TB, ctx context.Context, k enqueuer[A], key any, args A) bson.ObjectID {
	t.Helper()
	id, err := k.Enqueue(ctx, key, args)
	require.NoError(t, err)
	return id
}

// requireAccount requires the account id to hold balance after applied
// changes.
func (b *bundle) requireAccount(t testing.TB, id string, balance, applied int64, msgAndArgs ...any) {
	t.Helper()
	a := b.get(t, id)
	require.Equal(t, balance, a.Balance, msgAndArgs...)
	require.Equal(t, applied, a.Applied, msgAndArgs...)
}

func (b *bundle) get(t testing.TB, id string) *account {
	t.Helper()
	a, err := b.accounts.Get(b.ctx, id)
	require.NoError(t, err)
	return a
}

// run starts q.Run and returns a function that stops it and waits.
func run(t testing.TB, q *deferred.Queue) (stop func()) {
	t.Helper()
	return queuetest.Run(t, q)
}

// waitFor polls cond every 20ms for up to limit.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wait waits for job id to finish and returns it.
func wait(t testing.TB, q *deferred.Queue, id bson.ObjectID) *deferred.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job, err := q.Wait(ctx, id, 20*time.Millisecond)
	if err != nil {
		dumpQueue(t, q)
	}
	require.NoError(t, err)
	return job
}

// dumpQueue logs the queue's keys and its unfinished jobs: what a test that
// waited in vain needs to tell why.
func dumpQueue(t testing.TB, q *deferred.Queue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		coll   *mongo.Collection
		filter bson.D
	}{
		{q.Keys(), bson.D{}},
		{q.Jobs(), bson.D{{Key: "state", Value: bson.D{{Key: "$nin", Value: bson.A{deferred.StateCompleted}}}}}},
	} {
		cur, err := c.coll.Find(ctx, c.filter)
		if err != nil {
			t.Logf("dump %s: %v", c.coll.Name(), err)
			continue
		}
		var docs []bson.Raw
		if err := cur.All(ctx, &docs); err != nil {
			t.Logf("dump %s: %v", c.coll.Name(), err)
		}
		for i, d := range docs {
			if i == 40 {
				t.Logf("dump %s: %d more", c.coll.Name(), len(docs)-i)
				break
			}
			t.Logf("dump %s: %s", c.coll.Name(), d.String())
		}
	}
}

package move_test

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

func TestMoveCreditsTheTargetOnceAndCleansUp(t *testing.T) {
	b := setup(t)
	q := b.queue(t, nil)
	m := b.mover(t, q, nil, nil)
	b.insert(t, "ana", 100)
	b.insert(t, "ben", 5)

	id, err := m.Move(b.ctx, "ana", "ben", 30, nil)
	require.NoError(t, err)
	require.Equal(t, int64(70), b.balance(t, "ana"), "the debit is applied by Move itself")
	st, err := m.Status(b.ctx, "ana", id)
	require.NoError(t, err)
	require.Equal(t, move.Pending, st)
	total, err := m.Sum(b.ctx, "ana", "ben")
	require.NoError(t, err)
	require.Equal(t, int64(105), total.Sum, "the pending entry counts while it is in flight")
	require.Equal(t, 1, total.Pending)

	run(t, q)
	require.Equal(t, move.Done, waitStatus(t, m, id))
	b.requireNoMoveState(t)
	require.Equal(t, int64(70), b.balance(t, "ana"))
	require.Equal(t, int64(35), b.balance(t, "ben"))
	total, err = m.Sum(b.ctx, "ana", "ben")
	require.NoError(t, err)
	require.Equal(t, move.Total{Sum: 105, Values: 105, Reads: 2}, total)
}

func TestMoveOfMoreThanTheValueWritesNothing(t *testing.T) {
	b := setup(t)
	m := b.mover(t, b.queue(t, nil), nil, nil)
	b.insert(t, "ana", 10)
	b.insert(t, "ben", 0)
	before, err := b.accounts.Get(b.ctx, "ana")
	require.NoError(t, err)

	id, err := m.Move(b.ctx, "ana", "ben", 11, nil)
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	require.True(t, id.IsZero())
	_, err = m.Move(b.ctx, "ana", "ben", 5, bson.D{{Key: "closed", Value: true}})
	require.ErrorIs(t, err, versioned.ErrGuardFailed, "the caller's condition is part of the debit")
	_, err = m.Move(b.ctx, "nobody", "ben", 5, nil)
	require.ErrorIs(t, err, versioned.ErrNotFound)

	after, err := b.accounts.Get(b.ctx, "ana")
	require.NoError(t, err)
	require.Equal(t, before, after, "a failed debit writes nothing")
}

func TestMoveToAMissingTargetIsReturnedOnce(t *testing.T) {
	b := setup(t)
	q := b.queue(t, nil)
	m := b.mover(t, q, nil, nil)
	b.insert(t, "ana", 100)
	run(t, q)

	id, err := m.Move(b.ctx, "ana", "ghost", 40, nil)
	require.NoError(t, err)
	require.Equal(t, move.Returned, waitStatus(t, m, id))
	b.requireNoMoveState(t)
	require.Equal(t, int64(100), b.balance(t, "ana"))
}

func TestMoveRefusedByTheTargetIsReturnedOnce(t *testing.T) {
	b := setup(t)
	q := b.queue(t, nil)
	m := b.mover(t, q, nil, &move.Options{Field: "balance", Grace: time.Nanosecond,
		Accept: bson.D{{Key: "closed", Value: bson.D{{Key: "$ne", Value: true}}}}})
	b.insert(t, "ana", 100)
	require.NoError(t, b.accounts.Insert(b.ctx, &account{ID: "shut", Balance: 7, Closed: true}))
	run(t, q)

	id, err := m.Move(b.ctx, "ana", "shut", 40, nil)
	require.NoError(t, err)
	require.Equal(t, move.Returned, waitStatus(t, m, id))
	b.requireNoMoveState(t)
	require.Equal(t, int64(100), b.balance(t, "ana"))
	require.Equal(t, int64(7), b.balance(t, "shut"))
}

// TestCreditTheTargetCannotHoldIsReturnedOnce: a target whose value is not
// a number, or so large that the credit would pass the largest int64, makes
// the server refuse the credit's $inc; the move is returned, once, rather
// than retried until its job dies with the value pending. A target without
// the field takes the credit ($inc creates it).
func TestCreditTheTargetCannotHoldIsReturnedOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		balance any // nil: no balance field
		want    move.Status
		after   any
	}{
		{"a value that is not a number", "n/a", move.Returned, "n/a"},
		{"an array of numbers", bson.A{int64(1), int64(2)}, move.Returned, bson.A{int64(1), int64(2)}},
		{"a value the credit would overflow", int64(math.MaxInt64 - 39), move.Returned, int64(math.MaxInt64 - 39)},
		{"a value the credit just fits", int64(math.MaxInt64 - 40), move.Done, int64(math.MaxInt64)},
		{"no value", nil, move.Done, int64(40)},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			b := setup(t)
			q := b.queue(t, nil)
			m := b.mover(t, q, nil, nil)
			b.insert(t, "ana", 100)
			doc := bson.D{{Key: "_id", Value: "odd"}, {Key: "version", Value: int64(1)}}
			if tc.balance != nil {
				doc = append(doc, bson.E{Key: "balance", Value: tc.balance})
			}
			_, err := b.db.Collection("accounts").InsertOne(b.ctx, doc)
			require.NoError(t, err)
			run(t, q)

			id, err := m.Move(b.ctx, "ana", "odd", 40, nil)
			require.NoError(t, err)
			require.Equal(t, tc.want, waitStatus(t, m, id))
			b.requireNoMoveState(t)
			want := int64(60)
			if tc.want == move.Returned {
				want = 100
			}
			require.Equal(t, want, b.balance(t, "ana"))
			var odd bson.M
			require.NoError(t, b.db.Collection("accounts").FindOne(b.ctx, bson.D{{Key: "_id", Value: "odd"}}).Decode(&odd))
			require.Equal(t, tc.after, odd["balance"])
		})
	}
}

func TestBadInputIsRefusedBeforeAnythingIsSent(t *testing.T) {
	b := setup(t)
	q := b.queue(t, nil)
	m := b.mover(t, q, nil, nil)
	b.insert(t, "ana", 100)
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"zero amount":     func() error { _, err := m.Move(ctx, "ana", "ben", 0, nil); return err },
		"negative amount": func() error { _, err := m.Move(ctx, "ana", "ben", -5, nil); return err },
		"same document":   func() error { _, err := m.Move(ctx, "ana", "ana", 5, nil); return err },
		"same document as the server matches ids": func() error {
			_, err := m.Move(ctx, int32(7), int64(7), 5, nil)
			return err
		},
		"operator id": func() error {
			_, err := m.Move(ctx, bson.D{{Key: "$gt", Value: ""}}, "ben", 5, nil)
			return err
		},
		"nil target":  func() error { _, err := m.Move(ctx, "ana", nil, 5, nil); return err },
		"number cond": func() error { _, err := m.Move(ctx, "ana", "ben", 5, 7); return err },
		"status zero": func() error { _, err := m.Status(ctx, "ana", bson.ObjectID{}); return err },
		"sum operator": func() error {
			_, err := m.Sum(ctx, "ana", bson.D{{Key: "$ne", Value: 1}})
			return err
		},
	} {
		require.ErrorIs(t, call(), move.ErrInvalid, name)
	}
	require.ErrorIs(t, func() error { _, err := m.Move(ctx, bson.D{{Key: "$gt", Value: ""}}, "ben", 5, nil); return err }(), store.ErrInvalidID)
	for name, o := range map[string]move.Options{
		"no field":       {},
		"operator field": {Field: "$balance"},
		"dotted field":   {Field: "a.b"},
		"operator state": {Field: "balance", StateField: "$mv"},
		"same fields":    {Field: "balance", StateField: "balance"},
		"version field":  {Field: "version"},
	} {
		_, err := move.New(ctx, b.queue(t, nil), b.db.Collection("accounts"), &o)
		require.ErrorIs(t, err, move.ErrInvalid, name)
	}
	require.Equal(t, int64(100), b.balance(t, "ana"))
	_, err := m.Status(ctx, "ana", bson.NewObjectID())
	require.ErrorIs(t, err, move.ErrNotFound)
}

func TestMoveWhoseEnqueueFailedIsRelayedBySweep(t *testing.T) {
	b := setup(t)
	b.insert(t, "ana", 100)
	b.insert(t, "ben", 0)
	// The mover that moves enqueues through a fault proxy that refuses
	// every write to the queue: as if its process died between the debit
	// and the enqueue.
	f := b.db.Faulty(t, nil)
	f.ErrorBeforeApply(func(c *mongotest.Command) bool { return c.Collection == "jobs" || c.Collection == "jobs_keys" },
		mongotest.ServerError{Code: 2, CodeName: "BadValue"})
	dying := b.mover(t, b.queue(t, f.Database), nil, nil)
	q := b.queue(t, nil)
	relay := b.mover(t, q, nil, nil)
	run(t, q)

	id, err := dying.Move(b.ctx, "ana", "ben", 25, nil)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	st, err := relay.Status(b.ctx, "ana", id)
	require.NoError(t, err)
	require.Equal(t, move.Pending, st, "no job relays it yet")

	n, err := relay.Sweep(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, move.Done, waitStatus(t, relay, id))
	b.requireNoMoveState(t)
	require.Equal(t, int64(75), b.balance(t, "ana"))
	require.Equal(t, int64(25), b.balance(t, "ben"))
}

// TestCreditedMoveKeepsItsMarkerWhileItsSourceIsOutOfSight: the relay
// credits a move and dies before the source learns it; the source is
// deleted before the next job runs, and inserted again later with its
// pending entry. The job that found no source must leave the target's
// credit marker (the move's outcome is not recorded), so that the entry,
// seen again, is finished as done: without the marker it would be credited
// a second time.
func TestCreditedMoveKeepsItsMarkerWhileItsSourceIsOutOfSight(t *testing.T) {
	b := setup(t)
	q := b.queueOnce(t) // one attempt: a job that found the source gone and failed would not hide it by retrying
	m := b.mover(t, q, nil, nil)
	b.insert(t, "ana", 10)
	b.insert(t, "bob", 0)
	id, err := m.Move(b.ctx, "ana", "bob", 2, nil)
	require.NoError(t, err)
	b.creditThenLoseSource(t, q, m, "ana", "bob", id, bson.E{})
	require.Equal(t, move.Done, waitStatus(t, b.observer(t), id))
	b.requireNoMoveState(t)
	require.Equal(t, int64(8), b.balance(t, "ana"), "ana")
	require.Equal(t, int64(2), b.balance(t, "bob"), "bob")
}

func TestDuplicatedRelayJobsCreditOnce(t *testing.T) {
	b := setup(t)
	q := b.queue(t, nil)
	m := b.mover(t, q, nil, nil)
	ids := b.threeMovesToBen(t, m)
	// Before any job ran, every move gets a second job, and a third, from
	// another process's queue on the same jobs (two Sweeps at once do
	// that).
	type relayArgs struct {
		M        bson.ObjectID `bson:"m"`
		From, To string
		V        int64 `bson:"v"`
	}
	other, err := deferred.Register(b.queue(t, nil), move.DefaultName, func(context.Context, *deferred.Job, relayArgs) error { return nil })
	require.NoError(t, err)
	for range 2 {
		for _, id := range ids {
			_, err := other.Enqueue(b.ctx, "ben", relayArgs{M: id, From: "ana", To: "ben", V: 10})
			require.NoError(t, err)
		}
	}
	counts, err := q.Counts(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 9, counts[deferred.StateAvailable])
	run(t, q)
	for _, id := range ids {
		require.Equal(t, move.Done, waitStatus(t, m, id))
	}
	b.requireNoMoveState(t)
	require.Equal(t, int64(70), b.balance(t, "ana"))
	require.Equal(t, int64(30), b.balance(t, "ben"))
}

// TestOutcomesAreWrittenAtMajorityWhateverTheClientDefault: the relay
// removes a target's marker once the move's outcome is recorded, and a
// saga's steps are credited on its decision; both records are written with
// write concern majority even through a client whose default is w:1.
func TestOutcomesAreWrittenAtMajorityWhateverTheClientDefault(t *testing.T) {
	b := setup(t)
	var mu sync.Mutex
	var concerns []string
	opts := store.ClientOptions(b.db.Server.URI, nil).SetWriteConcern(writeconcern.W1()).SetMonitor(&event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			if coll, _ := e.Command.Lookup(e.CommandName).StringValueOK(); coll != "accounts_moves" || e.CommandName == "find" {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			concerns = append(concerns, e.CommandName+" "+e.Command.Lookup("writeConcern").String())
		},
	})
	client, err := mongo.Connect(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	db := client.Database(b.db.Name())
	q := b.queue(t, db)
	m := b.mover(t, q, db, &move.Options{Field: "balance", Grace: time.Nanosecond, Outcomes: db.Collection("accounts_moves")})
	b.insert(t, "ana", 100)
	b.insert(t, "ben", 0)
	run(t, q)

	id, err := m.Move(b.ctx, "ana", "ben", 30, nil)
	require.NoError(t, err)
	require.Equal(t, move.Done, waitStatus(t, m, id))
	saga, err := m.MoveAll(b.ctx, []move.Step{{From: "ana", To: "ben", Amount: 5}})
	require.NoError(t, err)
	require.Equal(t, move.Done, waitStatus(t, m, saga.Moves[0]))
	b.requireNoMoveState(t)

	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(concerns), 3, "the move's record, the saga's decision, its step's record: %v", concerns)
	for _, c := range concerns {
		require.Equal(t, `update {"w": "majority"}`, c)
	}
}

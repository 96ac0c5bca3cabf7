package move_test

// MoveAll: many moves, all or nothing (DESIGN.md, "Many moves, all or
// nothing"): a decided saga's moves are all credited or all returned,
// whatever fails, stalls or arrives late.

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/versioned"
)

// shop is the collection of items (mug 10, kettle 5, pan 3), an order
// (order-1, 0), a closed document (shut: it refuses credits), a fault
// proxy, a queue (not running) and a Mover whose traffic goes through the
// proxy.
type shop struct {
	*bundle
	f *mongotest.Faulty
	q *deferred.Queue
	m *move.Mover
}

var shopDocs = []any{"mug", "kettle", "pan", "order-1", "shut"}

const shopTotal = 18

func setupShop(t *testing.T, obs observe.Observer) *shop {
	t.Helper()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	q := b.queue(t, nil)
	m := b.mover(t, q, f.Database, &move.Options{Field: "balance", Grace: time.Nanosecond,
		Outcomes: f.Collection("accounts_moves"), Observer: obs,
		Accept: bson.D{{Key: "closed", Value: bson.D{{Key: "$ne", Value: true}}}}})
	b.insert(t, "mug", 10)
	b.insert(t, "kettle", 5)
	b.insert(t, "pan", 3)
	b.insert(t, "order-1", 0)
	require.NoError(t, b.accounts.Insert(b.ctx, &account{ID: "shut", Closed: true}))
	return &shop{bundle: b, f: f, q: q, m: m}
}

// order is the three steps of the shop's tests, into order-1: 2 mugs, a
// kettle and pans (3 are in stock).
func order(pan int64) []move.Step {
	return []move.Step{
		{From: "mug", To: "order-1", Amount: 2},
		{From: "kettle", To: "order-1", Amount: 1},
		{From: "pan", To: "order-1", Amount: pan},
	}
}

// waitSaga waits until every move of s is settled and the shop carries no
// move state, and requires each move's status to be want (or, for a
// returned saga, ErrNotFound for a step whose debit never landed).
func (s *shop) waitSaga(t *testing.T, steps []move.Step, saga move.Saga, want move.Status) {
	t.Helper()
	obs := s.observer(t)
	var st move.Status
	require.Eventually(t, func() bool { // the relay decides one MoveAll could not
		var err error
		st, err = obs.SagaStatus(s.ctx, saga.ID)
		if errors.Is(err, move.ErrNotFound) {
			return false
		}
		require.NoError(t, err)
		return true
	}, 2*time.Minute, 20*time.Millisecond, "the saga is undecided")
	require.Equal(t, want, st, "the saga's decision")
	for i, id := range saga.Moves {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			got, err := obs.Status(s.ctx, steps[i].From, id)
			if want == move.Returned && errors.Is(err, move.ErrNotFound) {
				break // its debit never landed
			}
			require.NoError(t, err, "step %d", i)
			if got != move.Pending {
				require.Equal(t, want, got, "step %d", i)
				break
			}
			require.False(t, time.Now().After(deadline), "step %d still pending after 2 minutes", i)
			time.Sleep(20 * time.Millisecond)
		}
	}
	s.requireNoMoveState(t)
}

func (s *shop) requireBalances(t *testing.T, want map[string]int64, when string) {
	t.Helper()
	for id, bal := range want {
		require.Equal(t, bal, s.balance(t, id), "%s: %s", id, when)
	}
	total, err := s.observer(t).Sum(s.ctx, shopDocs...)
	require.NoError(t, err)
	require.Equal(t, int64(shopTotal), total.Sum, when)
}

var (
	unchanged = map[string]int64{"mug": 10, "kettle": 5, "pan": 3, "order-1": 0, "shut": 0}
	ordered   = map[string]int64{"mug": 8, "kettle": 4, "pan": 0, "order-1": 6, "shut": 0}
)

// TestMoveAllCreditsEveryTargetOrReturnsEveryDebit runs a saga that lands,
// and sagas where one step fails at its source (short, missing) or at its
// target (refusing, missing): the failure says which step and why, and
// every debit already made is returned, exactly once.
func TestMoveAllCreditsEveryTargetOrReturnsEveryDebit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []move.Step
		step  int // the failing step, -1 for none
		end   string
		cause error
	}{
		{"every step lands", order(3), -1, "", nil},
		{"the last source is short", order(4), 2, "from", versioned.ErrGuardFailed},
		{"a source fails its condition", []move.Step{
			{From: "mug", To: "order-1", Amount: 2},
			{From: "kettle", To: "order-1", Amount: 1, Cond: bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: 100}}}}},
		}, 1, "from", versioned.ErrGuardFailed},
		{"a source is missing", []move.Step{
			{From: "mug", To: "order-1", Amount: 2},
			{From: "ghost", To: "order-1", Amount: 1},
		}, 1, "from", versioned.ErrNotFound},
		{"a target refuses", []move.Step{
			{From: "mug", To: "order-1", Amount: 2},
			{From: "kettle", To: "shut", Amount: 1},
		}, 1, "to", versioned.ErrGuardFailed},
		{"a target is missing", []move.Step{
			{From: "mug", To: "order-1", Amount: 2},
			{From: "kettle", To: "order-1", Amount: 1},
			{From: "pan", To: "ghost", Amount: 1},
		}, 2, "to", versioned.ErrNotFound},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			s := setupShop(t, nil)
			run(t, s.q)
			saga, err := s.m.MoveAll(s.ctx, tc.steps)
			require.Len(t, saga.Moves, len(tc.steps))
			if tc.step < 0 {
				require.NoError(t, err)
				s.waitSaga(t, tc.steps, saga, move.Done)
				s.requireBalances(t, ordered, "after the relay")
				return
			}
			require.ErrorIs(t, err, move.ErrAborted)
			require.ErrorIs(t, err, tc.cause)
			var se *move.StepError
			require.ErrorAs(t, err, &se)
			require.Equal(t, tc.step, se.Step)
			require.Equal(t, tc.end, se.End)
			require.Equal(t, saga.ID, se.Saga)
			s.waitSaga(t, tc.steps, saga, move.Returned)
			s.requireBalances(t, unchanged, "after the relay")
			// A relay job for every step whose debit landed, none for the
			// step whose debit was refused.
			jobs := tc.step
			if tc.end == "to" {
				jobs++
			}
			counts, err := s.q.Counts(s.ctx)
			require.NoError(t, err)
			var all int64
			for _, n := range counts {
				all += n
			}
			require.EqualValues(t, jobs, all, "relay jobs: %v", counts)
		})
	}
}

// TestMoveAllToATargetThatCannotHoldTheCreditIsReturned: a target whose
// value is not a number, or would pass the largest int64, is refused at its
// preparation, as one that does not match Options.Accept, so the saga is
// returned whole rather than decided done with a credit the server would
// refuse.
func TestMoveAllToATargetThatCannotHoldTheCreditIsReturned(t *testing.T) {
	for _, tc := range []struct {
		name    string
		balance any
	}{
		{"not a number", "n/a"},
		{"an array of numbers", bson.A{int64(1)}},
		{"a value the credit would overflow", int64(math.MaxInt64)},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			s := setupShop(t, nil)
			_, err := s.db.Collection("accounts").InsertOne(s.ctx, bson.D{
				{Key: "_id", Value: "label"}, {Key: "balance", Value: tc.balance}, {Key: "version", Value: int64(1)},
			})
			require.NoError(t, err)
			run(t, s.q)
			s.requireRefusedAtTarget(t, []move.Step{{From: "mug", To: "order-1", Amount: 2}, {From: "kettle", To: "label", Amount: 1}}, 1)
		})
	}
}

// TestMoveAllWhoseStepsTogetherOverflowATargetIsReturned: each of two
// steps into one target fits it alone, not both: the second step's
// preparation counts the first's amount, so the saga is returned whole
// rather than decided done with a credit the server would refuse. Amounts
// into one target that sum past the largest int64 are refused before
// anything is sent.
func TestMoveAllWhoseStepsTogetherOverflowATargetIsReturned(t *testing.T) {
	s := setupShop(t, nil)
	_, err := s.db.Collection("accounts").InsertOne(s.ctx, bson.D{
		{Key: "_id", Value: "big"}, {Key: "balance", Value: int64(math.MaxInt64 - 5)}, {Key: "version", Value: int64(1)},
	})
	require.NoError(t, err)
	run(t, s.q)
	s.requireRefusedAtTarget(t, []move.Step{{From: "mug", To: "big", Amount: 3}, {From: "kettle", To: "order-1", Amount: 1}, {From: "pan", To: "big", Amount: 3}}, 2)
	require.Equal(t, int64(math.MaxInt64-5), s.balance(t, "big"))

	_, err = s.m.MoveAll(s.ctx, []move.Step{{From: "mug", To: "big", Amount: math.MaxInt64/2 + 1}, {From: "kettle", To: "big", Amount: math.MaxInt64/2 + 1}})
	require.ErrorIs(t, err, move.ErrInvalid)
	s.requireBalances(t, unchanged, "after the refused saga")

	// One target named as the server matches it, 7 and NumberLong(7): its
	// steps are added up too.
	_, err = s.db.Collection("accounts").InsertOne(s.ctx, bson.D{
		{Key: "_id", Value: int64(7)}, {Key: "balance", Value: int64(math.MaxInt64 - 5)}, {Key: "version", Value: int64(1)},
	})
	require.NoError(t, err)
	s.requireRefusedAtTarget(t, []move.Step{{From: "mug", To: int32(7), Amount: 3}, {From: "kettle", To: int64(7), Amount: 3}}, 1)
}

// requireRefusedAtTarget runs MoveAll of steps and requires it to abort at
// step's preparation with a failed guard, every debit returned.
func (s *shop) requireRefusedAtTarget(t *testing.T, steps []move.Step, step int) {
	t.Helper()
	saga, err := s.m.MoveAll(s.ctx, steps)
	require.ErrorIs(t, err, move.ErrAborted)
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	var se *move.StepError
	require.ErrorAs(t, err, &se)
	require.Equal(t, step, se.Step)
	require.Equal(t, "to", se.End)
	s.waitSaga(t, steps, saga, move.Returned)
	s.requireBalances(t, unchanged, "after the relay")
}

// TestMoveAllRefusesBadInputAndWritesNothing: nothing is debited, nothing
// is decided.
func TestMoveAllRefusesBadInputAndWritesNothing(t *testing.T) {
	s := setupShop(t, nil)
	many := make([]move.Step, move.MaxSteps+1)
	for i := range many {
		many[i] = move.Step{From: "mug", To: "order-1", Amount: 1}
	}
	for name, steps := range map[string][]move.Step{
		"no step":          nil,
		"too many steps":   many,
		"a zero amount":    {{From: "mug", To: "order-1", Amount: 2}, {From: "kettle", To: "order-1", Amount: 0}},
		"a negative one":   {{From: "mug", To: "order-1", Amount: -2}},
		"the same ends":    {{From: "mug", To: "mug", Amount: 2}},
		"an operator id":   {{From: "mug", To: "order-1", Amount: 2}, {From: bson.M{"$gt": ""}, To: "order-1", Amount: 1}},
		"a nil target":     {{From: "mug", To: nil, Amount: 2}},
		"a cond not a doc": {{From: "mug", To: "order-1", Amount: 2, Cond: 42}},
	} {
		_, err := s.m.MoveAll(s.ctx, steps)
		require.ErrorIs(t, err, move.ErrInvalid, name)
		var ie *move.InvalidError
		require.ErrorAs(t, err, &ie, name)
	}
	s.requireBalances(t, unchanged, "after bad input")
	n, err := s.db.Collection("accounts_moves").CountDocuments(s.ctx, bson.D{})
	require.NoError(t, err)
	require.Zero(t, n, "a decision was written")
	s.requireNoMoveState(t)
}

// TestSagaWhoseDecisionNeverLandsIsReturnedByTheRelay: MoveAll debits and
// prepares every step, then its decision fails for good; the relay, finding
// no decision, decides returned and returns every debit.
func TestSagaWhoseDecisionNeverLandsIsReturnedByTheRelay(t *testing.T) {
	s := setupShop(t, nil)
	refused := s.f.ErrorBeforeApply(kindIs("decide"), mongotest.ServerError{Code: 2, CodeName: "BadValue"})
	run(t, s.q)
	steps := order(3)
	saga, err := s.m.MoveAll(s.ctx, steps)
	require.ErrorIs(t, err, versioned.ErrUnknownOutcome)
	require.NotErrorIs(t, err, move.ErrAborted)
	require.True(t, refused.HasFired())
	s.waitSaga(t, steps, saga, move.Returned)
	s.requireBalances(t, unchanged, "after the relay")
}

// stall is an Observer that, at the first debit it sees, runs fn.
type stall struct {
	once sync.Once
	fn   func()
}

func (s *stall) Start(ctx context.Context, _ observe.Event) context.Context { return ctx }
func (s *stall) Observe(_ context.Context, e observe.Event) {
	if e.Kind == observe.MoveDebited {
		s.once.Do(s.fn)
	}
}

// TestSagaStalledPastGraceIsReturnedAndItsLaterDebitsToo: MoveAll stalls
// after its first debit, longer than Grace; Sweep relays that debit, and
// the relay decides the saga returned. MoveAll then makes its other steps
// and finds the decision: it reports the abort (Step -1), and the debits
// it made after the decision are returned too.
func TestSagaStalledPastGraceIsReturnedAndItsLaterDebitsToo(t *testing.T) {
	var s *shop
	var saga move.Saga
	hook := &stall{}
	s = setupShop(t, hook)
	obs := s.observer(t)
	run(t, s.q)
	hook.fn = func() {
		_, err := obs.Sweep(s.ctx)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			n, err := s.db.Collection("accounts_moves").CountDocuments(s.ctx, bson.D{{Key: "saga", Value: true}, {Key: "outcome", Value: "returned"}})
			require.NoError(t, err)
			return n == 1
		}, time.Minute, 20*time.Millisecond, "the relay did not decide the stalled saga")
	}
	steps := order(3)
	saga, err := s.m.MoveAll(s.ctx, steps)
	require.ErrorIs(t, err, move.ErrAborted)
	var se *move.StepError
	require.ErrorAs(t, err, &se)
	require.Equal(t, -1, se.Step)
	require.Contains(t, err.Error(), "aborted by the relay")
	s.waitSaga(t, steps, saga, move.Returned)
	for i, id := range saga.Moves { // every step debited: all came back
		st, err := obs.Status(s.ctx, steps[i].From, id)
		require.NoError(t, err)
		require.Equal(t, move.Returned, st, "step %d", i)
	}
	s.requireBalances(t, unchanged, "after the relay")
}

// TestEverySagaWriteHeldAndDeliveredLateChangesNothing holds the first copy
// of each kind of write of a saga (the client gets a network error and the
// write is sent again), lets the saga settle, pushes the write ids out of
// every document, then delivers the copy: no balance, decision or status
// changes. A late preparation may leave a marker without value, which
// Sweep's relay removes (DESIGN.md).
func TestEverySagaWriteHeldAndDeliveredLateChangesNothing(t *testing.T) {
	for _, tc := range []struct {
		kind    string
		steps   []move.Step
		outcome move.Status
	}{
		{"debit", order(3), move.Done},
		{"prepare", order(3), move.Done},
		{"decide", order(3), move.Done},
		{"credit", order(3), move.Done},
		{"finish", order(3), move.Done},
		{"clean", order(3), move.Done},
		{"debit", order(4), move.Returned},
		{"prepare", order(4), move.Returned},
		{"decide", order(4), move.Returned},
		{"finish", order(4), move.Returned},
		{"clean", order(4), move.Returned},
	} {
		t.Run(tc.kind+"_"+string(tc.outcome), func(t *testing.T) {
			s := setupShop(t, nil)
			held := s.f.HoldNext(kindIs(tc.kind))
			run(t, s.q)
			saga, err := s.m.MoveAll(s.ctx, tc.steps)
			if tc.outcome == move.Done {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, move.ErrAborted)
			}
			s.waitSaga(t, tc.steps, saga, tc.outcome)
			select {
			case <-held.Fired():
			case <-time.After(time.Minute):
				t.Fatalf("no %s write was held", tc.kind)
			}
			want := ordered
			if tc.outcome == move.Returned {
				want = unchanged
			}
			s.requireBalances(t, want, "before the late copy")
			for _, id := range shopDocs {
				for range 20 {
					_, err := s.accounts.Guarded(s.ctx, id, nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "touched", Value: 1}}}})
					require.NoError(t, err)
				}
			}

			reply, err := held.Deliver(s.ctx)
			require.NoError(t, err)
			switch tc.kind {
			case "decide":
				require.Nil(t, reply.Lookup("upserted").Value, "the late decision inserted: %v", reply)
				require.EqualValues(t, 0, reply.Lookup("nModified").AsInt64(), "the late decision changed it: %v", reply)
			case "prepare":
				// It may land: a marker with no value, for a settled move.
				obs := s.observer(t)
				require.Eventually(t, func() bool {
					_, err := obs.Sweep(s.ctx)
					require.NoError(t, err)
					n, err := s.db.Collection("accounts").CountDocuments(s.ctx, bson.D{{Key: "_mv.n", Value: bson.D{{Key: "$gt", Value: 0}}}})
					require.NoError(t, err)
					return n == 0
				}, time.Minute, 100*time.Millisecond)
			default:
				require.Equal(t, bson.TypeNull, reply.Lookup("value").Type, "the late %s copy matched a document: %v", tc.kind, reply)
			}
			s.requireBalances(t, want, "after the late copy")
			s.waitSaga(t, tc.steps, saga, tc.outcome)
		})
	}
}

// TestDoneSagaKeepsItsPreparationWhileItsDebitIsOutOfSight: a saga is
// decided done; its first source is then out of sight of the relay (a
// program deletes it and inserts it again later: a read of the source that
// misses the debit). The relay's job for that step finds no pending entry
// and would remove the target's marker; it must not remove a prepared
// marker of a saga decided done, or the credit, which needs it, could never
// be made. Once the source is back, the step is credited: all or nothing
// holds, and nothing is left.
func TestDoneSagaKeepsItsPreparationWhileItsDebitIsOutOfSight(t *testing.T) {
	b := setup(t)
	q := b.queueOnce(t) // one attempt: a job that found the source gone and failed would not hide it by retrying
	m := b.mover(t, q, nil, nil)
	steps, saga := b.twoOrders(t, m)
	prepared := bson.D{{Key: "_id", Value: "order-1"}, {Key: "_mv.i." + saga.Moves[0].Hex() + ".p", Value: true}}
	b.loseSourceWhileRelaying(t, q, m, "mug", prepared, "the relay removed the prepared marker of a saga decided done")
	b.requireOrdersDone(t, steps, saga)
}

// TestCreditedStepKeepsItsMarkerWhileItsSourceIsOutOfSight: a done saga's
// step is credited (its job then dies before the source learns it), and
// the source is deleted before the relay runs again. The relay that finds
// no source must not remove the target's credit marker: when the source is
// inserted again with its pending entry, that marker is what tells the
// relay the step was credited. Without it the step would be returned to the
// source as well, and two units of stock would exist twice.
func TestCreditedStepKeepsItsMarkerWhileItsSourceIsOutOfSight(t *testing.T) {
	b := setup(t)
	q := b.queueOnce(t) // one attempt: a job that found the source gone and failed would not hide it by retrying
	m := b.mover(t, q, nil, nil)
	steps, saga := b.twoOrders(t, m)
	b.creditThenLoseSource(t, q, m, "mug", "order-1", saga.Moves[0], bson.E{Key: "g", Value: saga.ID})
	b.requireOrdersDone(t, steps, saga)
}

// creditThenLoseSource does what a relay job that dies right after its
// credit leaves (the target credited and marked by hand, as C or C_g would,
// with the extra field of the marker; the source's entry still pending),
// then deletes the source and runs the relay until its jobs end. It
// requires the target's marker to survive, inserts the source again as it
// was, and runs Sweep and the relay.
func (b *bundle) creditThenLoseSource(t *testing.T, q *deferred.Queue, m *move.Mover, from, to string, id bson.ObjectID, extra bson.E) {
	t.Helper()
	accounts := b.db.Collection("accounts")
	credited := "_mv.i." + id.Hex()
	marker := bson.D{{Key: "v", Value: int64(2)}, {Key: "from", Value: from}, {Key: "at", Value: time.Now()}}
	cond := bson.D{{Key: "_id", Value: to}, {Key: credited, Value: bson.D{{Key: "$exists", Value: false}}}}
	inc := bson.D{{Key: "balance", Value: int64(2)}, {Key: "_mv.n", Value: int64(1)}}
	if extra.Key != "" {
		marker = append(marker, extra)
		cond = bson.D{{Key: "_id", Value: to}, {Key: credited + ".p", Value: true}} // C_g: the prepared marker becomes the credit
		inc = inc[:1]
	}
	res, err := accounts.UpdateOne(b.ctx, cond, bson.D{{Key: "$inc", Value: inc}, {Key: "$set", Value: bson.D{{Key: credited, Value: marker}}}})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.ModifiedCount, "the credit did not apply")

	creditMarker := bson.D{{Key: "_id", Value: to}, {Key: credited + ".v", Value: int64(2)}, {Key: credited + ".p", Value: bson.D{{Key: "$exists", Value: false}}}}
	b.loseSourceWhileRelaying(t, q, m, from, creditMarker, "the relay removed the credit marker of a move whose source it could not see")
}

// loseSourceWhileRelaying deletes the account from and runs the relay until
// its jobs end, then requires the target's marker (one document matching
// marker) to be still there, inserts the source again as it was, and runs
// Sweep and the relay.
func (b *bundle) loseSourceWhileRelaying(t *testing.T, q *deferred.Queue, m *move.Mover, from string, marker bson.D, msg string) {
	t.Helper()
	accounts := b.db.Collection("accounts")
	src, err := accounts.FindOne(b.ctx, bson.D{{Key: "_id", Value: from}}).Raw()
	require.NoError(t, err)
	_, err = accounts.DeleteOne(b.ctx, bson.D{{Key: "_id", Value: from}})
	require.NoError(t, err)
	stop := run(t, q)
	b.waitJobsEnded(t, q)
	stop()
	n, err := accounts.CountDocuments(b.ctx, marker)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, msg)

	_, err = accounts.InsertOne(b.ctx, src)
	require.NoError(t, err)
	_, err = m.Sweep(b.ctx)
	require.NoError(t, err)
	run(t, q)
}

// TestDoneSagaStepWhoseTargetWasReplacedIsReturnedAlone: a saga is decided
// done, then one target is deleted and a new document is inserted under its
// id before the relay credits it. The new document was never prepared: its
// step is returned to its source, alone (the target left the set, as a
// missing one does), the other step is credited, and no relay job dies
// over it.
func TestDoneSagaStepWhoseTargetWasReplacedIsReturnedAlone(t *testing.T) {
	b := setup(t)
	q, _, saga := b.twoOrdersThenReplace(t, "order-1", 0)
	obs := b.observer(t)
	require.Equal(t, move.Returned, waitStatusFrom(t, obs, "mug", saga.Moves[0]))
	require.Equal(t, move.Done, waitStatusFrom(t, obs, "kettle", saga.Moves[1]))
	b.requireNoMoveState(t)
	b.requireBalances(t, map[string]int64{"mug": 10, "kettle": 4, "order-1": 0, "order-2": 1})
	counts, err := q.Counts(b.ctx)
	require.NoError(t, err)
	require.Zero(t, counts[deferred.StateDead], "a relay job died")
}

// TestDoneSagaStepWhoseSourceWasReplacedKeepsItsMarkerAndBlocksNothing: a
// saga is decided done, then one source is deleted and a new document
// without the step's entry is inserted under its id. The step can only be
// settled by the entry, so the target keeps its prepared marker (Unsettled
// lists it). The relay job that finds it ends at its first attempt with
// nothing done: it neither retries at the head of the target's key (the
// target's later moves would wait behind it) nor dies (dead jobs are kept:
// one per Sweep run would pile up).
func TestDoneSagaStepWhoseSourceWasReplacedKeepsItsMarkerAndBlocksNothing(t *testing.T) {
	b := setup(t)
	q, m, saga := b.twoOrdersThenReplace(t, "mug", 10)
	obs := b.observer(t)
	require.Equal(t, move.Done, waitStatusFrom(t, obs, "kettle", saga.Moves[1]))
	later, err := m.Move(b.ctx, "kettle", "order-1", 1, nil)
	require.NoError(t, err)
	require.Equal(t, move.Done, waitStatusFrom(t, obs, "kettle", later), "a move to the same target waited")
	for range 3 {
		b.waitJobsEnded(t, q)
		n, err := m.Sweep(b.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n, "Sweep finds the marker")
	}
	b.waitJobsEnded(t, q)
	jobs, err := q.Jobs().CountDocuments(b.ctx, bson.D{})
	require.NoError(t, err)
	require.GreaterOrEqual(t, jobs, int64(4), "the relay jobs of the saga, the move and the sweeps")
	again, err := q.Jobs().CountDocuments(b.ctx, bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: "state", Value: deferred.StateDead}}, bson.D{{Key: "attempt", Value: bson.D{{Key: "$gt", Value: 1}}}},
	}}})
	require.NoError(t, err)
	require.Zero(t, again, "a relay job died, or tried again, over a step only its source's entry can settle")

	entries, err := move.Unsettled(b.ctx, b.db.Collection("accounts"), "", 0)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, saga.Moves[0], entries[0].Move)
	require.Equal(t, move.Pending, entries[0].Outcome, "the prepared marker")
	b.requireBalances(t, map[string]int64{"mug": 10, "kettle": 3, "order-1": 1, "order-2": 1})
}

// twoOrdersThenReplace places twoOrders' saga (decided done) with no relay
// running, replaces the account id (replace), then starts the relay.
func (b *bundle) twoOrdersThenReplace(t *testing.T, id string, balance int64) (*deferred.Queue, *move.Mover, move.Saga) {
	t.Helper()
	q := b.queue(t, nil)
	m := b.mover(t, q, nil, nil)
	_, saga := b.twoOrders(t, m)
	b.replace(t, id, balance)
	run(t, q)
	return q, m, saga
}

// replace deletes the account id and inserts a new one under its id, with
// balance and no move state: what another program's delete and insert do.
func (b *bundle) replace(t *testing.T, id string, balance int64) {
	t.Helper()
	_, err := b.db.Collection("accounts").DeleteOne(b.ctx, bson.D{{Key: "_id", Value: id}})
	require.NoError(t, err)
	b.insert(t, id, balance)
}

// waitJobsEnded waits until every job of q is completed or dead.
func (b *bundle) waitJobsEnded(t *testing.T, q *deferred.Queue) {
	t.Helper()
	require.Eventually(t, func() bool {
		counts, err := q.Counts(b.ctx)
		require.NoError(t, err)
		queued, err := q.Jobs().CountDocuments(b.ctx, bson.D{})
		require.NoError(t, err)
		return counts[deferred.StateCompleted]+counts[deferred.StateDead] == queued
	}, time.Minute, 20*time.Millisecond, "the relay jobs did not end")
}

// TestLatePreparationOfASettledStepIsRemoved: a copy of a preparation that
// lands after its step was credited and settled (what a held P copy writes
// once the versioned anchors are gone) leaves a marker with no value on the
// target; Sweep's relay finds the step's outcome recorded and removes it,
// though the saga is done, and no balance changes.
func TestLatePreparationOfASettledStepIsRemoved(t *testing.T) {
	s := setupShop(t, nil)
	run(t, s.q)
	steps := order(3)
	saga, err := s.m.MoveAll(s.ctx, steps)
	require.NoError(t, err)
	s.waitSaga(t, steps, saga, move.Done)

	late := "_mv.i." + saga.Moves[0].Hex()
	_, err = s.db.Collection("accounts").UpdateOne(s.ctx, bson.D{{Key: "_id", Value: "order-1"}, {Key: late, Value: bson.D{{Key: "$exists", Value: false}}}}, bson.D{
		{Key: "$inc", Value: bson.D{{Key: "_mv.n", Value: int64(1)}}},
		{Key: "$set", Value: bson.D{{Key: late, Value: bson.D{
			{Key: "p", Value: true}, {Key: "v", Value: int64(2)}, {Key: "from", Value: "mug"}, {Key: "g", Value: saga.ID}, {Key: "at", Value: time.Now()},
		}}}},
	})
	require.NoError(t, err)
	_, err = s.observer(t).Sweep(s.ctx)
	require.NoError(t, err)
	s.requireNoMoveState(t)
	s.requireBalances(t, ordered, "after the late preparation was removed")
	st, err := s.observer(t).SagaStatus(s.ctx, saga.ID)
	require.NoError(t, err)
	require.Equal(t, move.Done, st)
}

// requireOrdersDone waits until both steps of twoOrders' saga are credited,
// then requires every record of them gone and each stock moved once.
func (b *bundle) requireOrdersDone(t *testing.T, steps []move.Step, saga move.Saga) {
	t.Helper()
	obs := b.observer(t)
	for i, id := range saga.Moves {
		require.Equal(t, move.Done, waitStatusFrom(t, obs, steps[i].From, id), "step %d", i)
	}
	b.requireNoMoveState(t)
	b.requireBalances(t, map[string]int64{"mug": 8, "kettle": 4, "order-1": 2, "order-2": 1})
}

// twoOrders inserts mug 10, kettle 5, order-1 and order-2 (0), and makes
// a saga of 2 mugs to order-1 and a kettle to order-2 with m, decided done.
func (b *bundle) twoOrders(t *testing.T, m *move.Mover) ([]move.Step, move.Saga) {
	t.Helper()
	b.insert(t, "mug", 10)
	b.insert(t, "kettle", 5)
	b.insert(t, "order-1", 0)
	b.insert(t, "order-2", 0)
	steps := []move.Step{{From: "mug", To: "order-1", Amount: 2}, {From: "kettle", To: "order-2", Amount: 1}}
	saga, err := m.MoveAll(b.ctx, steps)
	require.NoError(t, err)
	return steps, saga
}

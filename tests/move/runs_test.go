package move_test

// Runs of relay jobs into one target (DESIGN.md, "Runs of moves into one
// target"): their credits in one statement B, their outcomes in one
// command and their markers removed in one statement, each of these writes
// attacked as the per-move tests attack a move's.

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/move"
)

// runSources are the sources of the run tests' moves into ben, in order.
var runSources = []string{"ana", "cal", "dee", "ana"}

// queuedRun inserts cal and dee (100 each) beside setupFaulty's accounts
// and, with the queue not running, moves 10 into ben from each of
// runSources: four relay jobs of one target, due together.
func queuedRun(t *testing.T, b *bundle, m *move.Mover) []bson.ObjectID {
	t.Helper()
	b.insert(t, "cal", 100)
	b.insert(t, "dee", 100)
	ids := make([]bson.ObjectID, len(runSources))
	for i, from := range runSources {
		id, err := m.Move(b.ctx, from, "ben", 10, nil)
		require.NoError(t, err)
		ids[i] = id
	}
	return ids
}

// requireRunDone waits for the moves of queuedRun to settle, and requires
// each done once: balances, sum and no state left.
func requireRunDone(t *testing.T, b *bundle, ids []bson.ObjectID, when string) {
	t.Helper()
	obs := b.observer(t)
	for i, id := range ids {
		require.Equal(t, move.Done, waitStatusFrom(t, obs, runSources[i], id), "move %d (%s)", i, when)
	}
	b.requireNoMoveState(t)
	b.requireBalances(t, map[string]int64{"ana": 80, "cal": 90, "dee": 90, "ben": 40})
	total, err := obs.Sum(b.ctx, "ana", "ben", "cal", "dee")
	require.NoError(t, err, when)
	require.Equal(t, int64(300), total.Sum, when)
}

// runWriteKinds are the kinds (writeKind) of the writes a run makes: B,
// F, O, U and K_B.
var runWriteKinds = []string{"credit", "finish", "outcome", "record", "clean"}

// settleRunUnder queues the run of queuedRun with the faults arm sets on
// the proxy, runs the relay and waits until every move of the run is done
// once. It returns the bundle, the moves and the faults.
func settleRunUnder(t *testing.T, arm func(f *mongotest.Faulty) []*mongotest.Fault) (*bundle, []bson.ObjectID, []*mongotest.Fault) {
	t.Helper()
	b, f, q, m := setupRunFaulty(t)
	faults := arm(f)
	ids := queuedRun(t, b, m)
	run(t, q)
	requireRunDone(t, b, ids, "settled under the faults")
	return b, ids, faults
}

// count matches every command of match and changes nothing: Matched lists
// them.
func count(f *mongotest.Faulty, match mongotest.Match) *mongotest.Fault {
	return f.RewriteReplies(1_000_000, match, func(_ *mongotest.Command, reply bson.Raw) (bson.Raw, error) { return reply, nil })
}

// setupRunFaulty is setupFaulty with the outcome records written through
// the proxy too: O is one of a run's writes.
func setupRunFaulty(t *testing.T) (*bundle, *mongotest.Faulty, *deferred.Queue, *move.Mover) {
	t.Helper()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	q := b.queue(t, nil)
	m := b.mover(t, q, f.Database, runOptions(f))
	b.insert(t, "ana", 100)
	b.insert(t, "ben", 0)
	require.NoError(t, b.accounts.Insert(b.ctx, &account{ID: "shut", Closed: true}))
	return b, f, q, m
}

// runOptions are the Options of setupRunFaulty's Mover.
func runOptions(f *mongotest.Faulty) *move.Options {
	return &move.Options{Field: "balance", Grace: time.Nanosecond,
		Outcomes: f.Collection("accounts_moves"),
		Accept:   bson.D{{Key: "closed", Value: bson.D{{Key: "$ne", Value: true}}}}}
}

func TestRunOfMovesIntoOneTargetIsCreditedInOneWrite(t *testing.T) {
	b, f, q, m := setupRunFaulty(t)
	credits := count(f, kindIs("credit"))
	ids := queuedRun(t, b, m)
	run(t, q)

	requireRunDone(t, b, ids, "after the run")
	got := credits.Matched()
	require.Len(t, got, 1, "one statement credits the run of four moves")
	for _, id := range ids {
		require.Contains(t, got[0].Body.String(), id.Hex())
	}
}

func TestAcceptThatReadsTheValueCreditsOneMoveAtATime(t *testing.T) {
	b := setup(t)
	f := b.db.Faulty(t, nil)
	q := b.queue(t, nil)
	// A cap: a run's credits checked together would pass it.
	m := b.mover(t, q, f.Database, &move.Options{Field: "balance", Grace: time.Nanosecond,
		Outcomes: b.db.Collection("accounts_moves"),
		Accept:   bson.D{{Key: "balance", Value: bson.D{{Key: "$lt", Value: 25}}}}})
	b.insert(t, "ana", 100)
	b.insert(t, "ben", 0)
	credits := count(f, kindIs("credit"))
	ids := queuedRun(t, b, m)
	run(t, q)

	obs := b.observer(t)
	statuses := make([]move.Status, 0, len(ids))
	for i, id := range ids {
		statuses = append(statuses, waitStatusFrom(t, obs, runSources[i], id))
	}
	b.requireNoMoveState(t)
	// ben takes 10, 10 and 10 (20 < 25 still), then is at 30: refused.
	require.Equal(t, []move.Status{move.Done, move.Done, move.Done, move.Returned}, statuses)
	b.requireBalances(t, map[string]int64{"ana": 90, "cal": 90, "dee": 90, "ben": 30})
	require.Len(t, credits.Matched(), 4, "each credit sent alone")
}

// TestEveryRunWriteHeldAndDeliveredLateMatchesNothing holds the first copy
// of each kind of write a run makes (B, F, O, U, K_B), lets the run settle,
// pushes the write ids out of every document, then delivers the copy.
func TestEveryRunWriteHeldAndDeliveredLateMatchesNothing(t *testing.T) {
	for _, kind := range runWriteKinds {
		t.Run(kind, func(t *testing.T) {
			b, ids, faults := settleRunUnder(t, func(f *mongotest.Faulty) []*mongotest.Fault {
				return []*mongotest.Fault{f.HoldNext(kindIs(kind))}
			})
			held := faults[0]
			select {
			case <-held.Fired():
			case <-time.After(time.Minute):
				t.Fatalf("no %s write was held", kind)
			}
			for _, acct := range []string{"ana", "ben", "cal", "dee"} {
				for range 20 {
					_, err := b.accounts.Guarded(b.ctx, acct, nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "touched", Value: 1}}}})
					require.NoError(t, err)
				}
			}
			reply, err := held.Deliver(b.ctx)
			require.NoError(t, err)
			if kind == "outcome" {
				require.EqualValues(t, 0, reply.Lookup("nModified").AsInt64(), "the late outcome copy changed a record: %v", reply)
				_, upserted := reply.Lookup("upserted").ArrayOK()
				require.False(t, upserted, "the late outcome copy inserted a record: %v", reply)
			} else {
				require.Equal(t, bson.TypeNull, reply.Lookup("value").Type, "the late %s copy matched a document: %v", kind, reply)
			}
			requireRunDone(t, b, ids, "after the late copy")
		})
	}
}

// TestRunCreditCopyOfAGivenUpAttemptNeverLandsAfterTheMarkersAreGone is
// Lemma 2 for B: the run's credit is held in the network and the copy sent
// again refused, so the attempt gives up with its first copy out; the next
// attempt credits the run, which settles and loses its markers. The held
// copy, delivered then, finds the markers gone and its anchor still listed:
// only the fence (the run's first job's) stops it.
func TestRunCreditCopyOfAGivenUpAttemptNeverLandsAfterTheMarkersAreGone(t *testing.T) {
	b, ids, faults := settleRunUnder(t, func(f *mongotest.Faulty) []*mongotest.Fault {
		return []*mongotest.Fault{
			f.HoldNext(kindIs("credit")),
			f.ErrorBeforeApply(kindIs("credit"), mongotest.ServerError{Code: 2, CodeName: "BadValue"}),
		}
	})
	held, refused := faults[0], faults[1]
	require.True(t, held.HasFired() && refused.HasFired(), "the first attempt gave up with its copy held")
	reply, err := held.Deliver(b.ctx)
	require.NoError(t, err)
	require.Equal(t, bson.TypeNull, reply.Lookup("value").Type, "the held run credit landed again: %v", reply)
	requireRunDone(t, b, ids, "after the late copy")
}

// TestLostRepliesOfEveryRunWriteSettleOnce drops the reply of the first copy
// of each kind of write a run makes, after the server applied it.
func TestLostRepliesOfEveryRunWriteSettleOnce(t *testing.T) {
	for _, kind := range runWriteKinds {
		t.Run(kind, func(t *testing.T) {
			_, _, faults := settleRunUnder(t, func(f *mongotest.Faulty) []*mongotest.Fault {
				return []*mongotest.Fault{f.DropNextReply(kindIs(kind))}
			})
			require.True(t, faults[0].HasFired(), "no %s reply was dropped", kind)
		})
	}
}

// TestRunWithAMoveThatCannotBeCreditedGoesOneByOne puts into runs what B
// cannot take whole: a move credited already (its relay failed at F), a
// saga's step, and a target that refuses every credit. Each move settles
// once, as it would alone.
func TestRunWithAMoveThatCannotBeCreditedGoesOneByOne(t *testing.T) {
	b, f, q, m := setupRunFaulty(t)
	b.insert(t, "cal", 100)
	b.insert(t, "dee", 100)
	credits := count(f, kindIs("credit"))

	// ana→ben credited by a relay that gives a job one attempt, its F
	// refused: the job dies with the marker on ben, and Sweep enqueues
	// the move again, ahead of the others.
	onceQ := b.queueWith(t, nil, 1)
	once := b.mover(t, onceQ, f.Database, runOptions(f))
	first, err := once.Move(b.ctx, "ana", "ben", 10, nil)
	require.NoError(t, err)
	failed := failWrite(f, "finish", first)
	stop := run(t, onceQ)
	select {
	case <-failed.Fired():
	case <-time.After(time.Minute):
		t.Fatal("the first move's finish was not refused")
	}
	require.Eventually(t, func() bool {
		n, err := b.db.Collection("jobs").CountDocuments(b.ctx, bson.D{{Key: "state", Value: deferred.StateDead}})
		return err == nil && n == 1
	}, time.Minute, 10*time.Millisecond, "the first move's job did not die")
	stop()
	swept, err := m.Sweep(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, swept)

	plain := map[string]bson.ObjectID{"first": first}
	for name, from := range map[string]string{"second": "cal", "third": "dee"} {
		id, err := m.Move(b.ctx, from, "ben", 10, nil)
		require.NoError(t, err)
		plain[name] = id
	}
	saga, err := m.MoveAll(b.ctx, []move.Step{{From: "cal", To: "ben", Amount: 5}, {From: "dee", To: "ana", Amount: 5}})
	require.NoError(t, err)
	last, err := m.Move(b.ctx, "ana", "ben", 10, nil)
	require.NoError(t, err)
	refused := make([]bson.ObjectID, 0, 2)
	for range 2 {
		id, err := m.Move(b.ctx, "cal", "shut", 7, nil)
		require.NoError(t, err)
		refused = append(refused, id)
	}
	run(t, q)

	obs := b.observer(t)
	require.Equal(t, move.Done, waitStatusFrom(t, obs, "ana", first))
	require.Equal(t, move.Done, waitStatusFrom(t, obs, "cal", plain["second"]))
	require.Equal(t, move.Done, waitStatusFrom(t, obs, "dee", plain["third"]))
	require.Equal(t, move.Done, waitStatusFrom(t, obs, "ana", last))
	for _, id := range refused {
		require.Equal(t, move.Returned, waitStatusFrom(t, obs, "cal", id))
	}
	for i, id := range saga.Moves {
		require.Equal(t, move.Done, waitStatusFrom(t, obs, []string{"cal", "dee"}[i], id), "saga step %d", i)
	}
	b.requireNoMoveState(t)
	b.requireBalances(t, map[string]int64{"ana": 85, "ben": 45, "cal": 85, "dee": 85, "shut": 0})
	total, err := obs.Sum(b.ctx, "ana", "ben", "cal", "dee", "shut")
	require.NoError(t, err)
	require.Equal(t, int64(300), total.Sum)

	// The second and third moves were credited together, after the run
	// holding the first one's marker went one by one.
	together := false
	for _, c := range credits.Matched() {
		body := c.Body.String()
		together = together || strings.Contains(body, plain["second"].Hex()) && strings.Contains(body, plain["third"].Hex())
	}
	require.True(t, together, "no statement credited the second and third moves together")
}

package move_test

// Every write of a move held in the network and delivered late, and every
// reply lost: the move settles exactly once, and a late copy delivered
// after it settled matches nothing (DESIGN.md, Lemmas 2 and 3).

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

// writeKind names a move's write from its findAndModify on the accounts:
// debit, credit, refusal, prepare (MoveAll's), finish, record, clean; and
// from its update of the outcomes: decide, MoveAll's and the relay's upsert
// of a saga's decision, and outcome, the relay's O; "" for anything else.
func writeKind(c *mongotest.Command) string {
	if strings.EqualFold(c.Name, "update") && c.Collection == "accounts_moves" {
		for _, u := range c.Sequences["updates"] {
			if strings.Contains(u.String(), `"saga"`) {
				return "decide"
			}
		}
		if strings.Contains(c.Body.String(), `"saga"`) {
			return "decide"
		}
		return "outcome"
	}
	if !strings.EqualFold(c.Name, "findAndModify") || c.Collection != "accounts" {
		return ""
	}
	upd, ok := c.Body.Lookup("update").DocumentOK()
	if !ok {
		return ""
	}
	has := func(op, prefix string) bool {
		d, ok := upd.Lookup(op).DocumentOK()
		if !ok {
			return false
		}
		elems, _ := d.Elements()
		for _, e := range elems {
			if strings.HasPrefix(e.Key(), prefix) {
				return true
			}
		}
		return false
	}
	switch {
	case has("$set", "_mv.o."):
		return "debit"
	case has("$set", "_mv.i.") && has("$inc", "balance"):
		return "credit"
	case has("$set", "_mv.i.") && strings.Contains(upd.Lookup("$set").String(), `"p": true`):
		return "prepare"
	case has("$set", "_mv.i."):
		return "refusal"
	case has("$unset", "_mv.o."):
		return "finish"
	case has("$unset", "_mv.d."):
		return "record"
	case has("$unset", "_mv.i."):
		return "clean"
	}
	return ""
}

// failWrite makes the next write of kind (writeKind) of move id through f
// fail for sure, before it applies, with an error no retry gets past.
func failWrite(f *mongotest.Faulty, kind string, id bson.ObjectID) *mongotest.Fault {
	return f.ErrorBeforeApply(func(c *mongotest.Command) bool {
		return writeKind(c) == kind && strings.Contains(c.Body.String(), id.Hex())
	}, mongotest.ServerError{Code: 2, CodeName: "BadValue"})
}

func kindIs(kind string) mongotest.Match {
	return func(c *mongotest.Command) bool { return writeKind(c) == kind }
}

// TestEveryMoveWriteHeldAndDeliveredLateMatchesNothing holds the first copy
// of each kind of write of a move (its client gets a network error, the
// settle engine or the relay's next attempt sends it again), lets the move
// settle, then delivers the held copy: balances, outcome and state must be
// as if it never arrived.
func TestEveryMoveWriteHeldAndDeliveredLateMatchesNothing(t *testing.T) {
	for _, tc := range []struct {
		kind    string
		to      string
		outcome move.Status
	}{
		{"debit", "ben", move.Done},
		{"credit", "ben", move.Done},
		{"finish", "ben", move.Done},
		{"record", "ben", move.Done},
		{"clean", "ben", move.Done},
		{"refusal", "shut", move.Returned},
		{"finish", "shut", move.Returned},
		{"clean", "shut", move.Returned},
		{"finish", "ghost", move.Returned},
	} {
		t.Run(tc.kind+"_to_"+tc.to, func(t *testing.T) {
			b, f, q, m := setupFaulty(t)
			held := f.HoldNext(kindIs(tc.kind))
			run(t, q)

			id, err := m.Move(b.ctx, "ana", tc.to, 30, nil)
			require.NoError(t, err)
			require.Equal(t, tc.outcome, waitStatus(t, b.observer(t), id))
			b.requireNoMoveState(t)
			select {
			case <-held.Fired():
			case <-time.After(time.Minute):
				t.Fatalf("no %s write was held", tc.kind)
			}
			want := map[string]int64{"ana": 70, "ben": 30, "shut": 0}
			if tc.outcome == move.Returned {
				want = map[string]int64{"ana": 100, "ben": 0, "shut": 0}
			}
			check := func(when string) {
				for id, bal := range want {
					require.Equal(t, bal, b.balance(t, id), "%s: %s", id, when)
				}
				total, err := b.observer(t).Sum(b.ctx, "ana", "ben", "shut")
				require.NoError(t, err)
				require.Equal(t, int64(100), total.Sum, when)
			}
			check("before the late copy")
			// Push the write ids the copy was sent with out of every
			// document's list, so that versioned's anchor no longer stops
			// it: only the move's own conditions and the relay's fence can.
			for _, acct := range []string{"ana", "ben", "shut"} {
				for range 20 {
					_, err := b.accounts.Guarded(b.ctx, acct, nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "touched", Value: 1}}}})
					require.NoError(t, err)
				}
			}

			reply, err := held.Deliver(b.ctx)
			require.NoError(t, err)
			require.Equal(t, bson.TypeNull, reply.Lookup("value").Type, "the late %s copy matched a document: %v", tc.kind, reply)
			check("after the late copy")
			st, err := b.observer(t).Status(b.ctx, "ana", id)
			require.NoError(t, err)
			require.Equal(t, tc.outcome, st)
		})
	}
}

// TestLostRepliesOfEveryMoveWriteSettleOnce drops the reply of the first
// copy of each kind of write, after the server applied it.
func TestLostRepliesOfEveryMoveWriteSettleOnce(t *testing.T) {
	for _, kind := range []string{"debit", "credit", "refusal", "finish", "record", "clean"} {
		t.Run(kind, func(t *testing.T) {
			b, f, q, m := setupFaulty(t)
			dropped := f.DropNextReply(kindIs(kind))
			run(t, q)

			to, outcome, want := "ben", move.Done, map[string]int64{"ana": 70, "ben": 30}
			if kind == "refusal" {
				to, outcome, want = "shut", move.Returned, map[string]int64{"ana": 100, "shut": 0}
			}
			id, err := m.Move(b.ctx, "ana", to, 30, nil)
			require.NoError(t, err)
			require.Equal(t, outcome, waitStatus(t, b.observer(t), id))
			b.requireNoMoveState(t)
			require.True(t, dropped.HasFired(), "no %s reply was dropped", kind)
			for acct, bal := range want {
				require.Equal(t, bal, b.balance(t, acct), acct)
			}
		})
	}
}

// TestCreditCopyOfAGivenUpAttemptNeverLandsAfterTheMarkerIsGone is the case
// the relay's fence exists for (DESIGN.md, Lemma 2): an attempt's credit is
// held in the network and the copy sent again fails, so the attempt gives up
// with its first copy still out; the next attempt credits, and the move
// settles and its marker is removed. The held copy, delivered then, finds
// the marker gone and its anchor still listed: only the fence stops it.
func TestCreditCopyOfAGivenUpAttemptNeverLandsAfterTheMarkerIsGone(t *testing.T) {
	b := setup(t)
	f := b.db.Faulty(t, nil)
	q := b.queue(t, nil)
	m := b.mover(t, q, f.Database, nil)
	b.insert(t, "ana", 100)
	b.insert(t, "ben", 0)
	held := f.HoldNext(kindIs("credit"))
	refused := f.ErrorBeforeApply(kindIs("credit"), mongotest.ServerError{Code: 2, CodeName: "BadValue"})
	run(t, q)

	id, err := m.Move(b.ctx, "ana", "ben", 30, nil)
	require.NoError(t, err)
	obs := b.observer(t)
	require.Equal(t, move.Done, waitStatus(t, obs, id))
	b.requireNoMoveState(t)
	require.True(t, held.HasFired() && refused.HasFired(), "the first attempt gave up with its copy held")

	reply, err := held.Deliver(b.ctx)
	require.NoError(t, err)
	require.Equal(t, bson.TypeNull, reply.Lookup("value").Type, "the held credit landed again: %v", reply)
	require.Equal(t, int64(70), b.balance(t, "ana"))
	require.Equal(t, int64(30), b.balance(t, "ben"))
	total, err := obs.Sum(b.ctx, "ana", "ben")
	require.NoError(t, err)
	require.Equal(t, int64(100), total.Sum)
}

// setupFaulty returns a bundle with accounts ana (100), ben (0) and shut
// (closed: it refuses credits), a fault proxy, a queue (not running) and a
// Mover whose traffic goes through the proxy.
func setupFaulty(t *testing.T) (*bundle, *mongotest.Faulty, *deferred.Queue, *move.Mover) {
	t.Helper()
	b := setup(t)
	f := b.db.Faulty(t, nil)
	q := b.queue(t, nil)
	m := b.mover(t, q, f.Database, &move.Options{Field: "balance", Grace: time.Nanosecond,
		Outcomes: b.db.Collection("accounts_moves"),
		Accept:   bson.D{{Key: "closed", Value: bson.D{{Key: "$ne", Value: true}}}}})
	b.insert(t, "ana", 100)
	b.insert(t, "ben", 0)
	require.NoError(t, b.accounts.Insert(b.ctx, &account{ID: "shut", Closed: true}))
	return b, f, q, m
}

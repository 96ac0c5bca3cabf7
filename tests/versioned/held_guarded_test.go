package versioned_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

// A Guarded whose first copy is held in the network (its reply lost), and
// whose copy sent again then fails its condition, is never reported as a
// failed guard: a caller told ErrGuardFailed may take it that nothing was
// written, yet the held copy is still in flight. It is an unknown outcome,
// and the test shows why no other answer is true: once the stock is raised,
// the held copy of the anchored form (a document that carries write ids)
// applies when it arrives; that of the pinned form (a document without
// them, whose write pins the version) matches nothing, the version having
// moved. See DESIGN.md, "A held copy of Guarded".
func TestGuardedWhoseHeldCopyMayStillApplyIsAnUnknownOutcome(t *testing.T) {
	for _, c := range []struct {
		name  string
		ids   bool  // the document carries write ids: the anchored form
		lands int64 // whether the held copy applies once the stock is raised
	}{
		{"anchored", true, 1},
		{"pinned", false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			plain, b := setup[item](t, nil)
			f := b.db.Faulty(t, nil)
			repo, err := versioned.New[item](f.Collection(b.coll.Name()), nil)
			require.NoError(t, err)
			if c.ids {
				require.NoError(t, plain.Insert(b.ctx, &item{SKU: "s"}))
			} else {
				_, err := b.coll.InsertOne(b.ctx, bson.D{{Key: "_id", Value: "s"}, {Key: "stock", Value: int64(0)}, {Key: "version", Value: int64(3)}})
				require.NoError(t, err)
			}
			before, err := plain.Get(b.ctx, "s")
			require.NoError(t, err)

			held := f.HoldNext(mongotest.Writes(b.coll.Name()))
			_, err = repo.Guarded(b.ctx, "s", bson.D{{Key: "stock", Value: bson.D{{Key: "$gte", Value: int64(1)}}}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: int64(-1)}}}})
			require.True(t, held.HasFired(), "the first copy was held")
			require.ErrorIs(t, err, versioned.ErrUnknownOutcome)
			require.NotErrorIs(t, err, versioned.ErrGuardFailed, "a copy is in flight: not a failed guard")
			var ue *versioned.UnknownOutcomeError
			require.ErrorAs(t, err, &ue)
			require.Equal(t, before.Version, ue.Base)
			require.Equal(t, before.Version, ue.Current, "nothing written so far")
			require.EqualValues(t, 0, b.raw(t, "s")["stock"])

			// The stock is raised, then the held copy arrives.
			_, err = plain.Guarded(b.ctx, "s", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: int64(5)}}}})
			require.NoError(t, err)
			reply, err := held.Deliver(b.ctx)
			require.NoError(t, err)
			n, ok := reply.Lookup("lastErrorObject", "n").AsInt64OK()
			require.True(t, ok, "findAndModify reply: %v", reply)
			require.Equal(t, c.lands, n)
			raw := b.raw(t, "s")
			require.EqualValues(t, 5-c.lands, raw["stock"], "the held copy applied at most once")
			require.EqualValues(t, before.Version+1+c.lands, raw["version"])
		})
	}
}

package versioned_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

func TestInsertGet(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)

	a := &account{ID: "a1", Owner: "ana", Balance: 100, Tags: []string{"x"}, Version: 42}
	require.NoError(t, repo.Insert(b.ctx, a))
	require.NotEqual(t, int64(42), a.Version, "Insert sets the version, whatever the copy held")
	require.Positive(t, a.Version)

	got, err := repo.Get(b.ctx, "a1")
	require.NoError(t, err)
	require.Equal(t, a, got)

	m := b.raw(t, "a1")
	require.Equal(t, a.Version, m["version"])
	require.Len(t, b.writeIDs(t, "a1"), 1, "the insert stamped its write id")

	var dup *versioned.DuplicateError
	err = repo.Insert(b.ctx, &account{ID: "a1", Owner: "bob"})
	require.ErrorIs(t, err, versioned.ErrDuplicate)
	require.ErrorAs(t, err, &dup)
	require.Equal(t, "a1", dup.ID)
	var we mongo.WriteException
	require.ErrorAs(t, err, &we, "the driver's error stays reachable")
	require.Equal(t, "ana", b.raw(t, "a1")["owner"], "the duplicate wrote nothing")

	_, err = repo.Get(b.ctx, "nope")
	var nf *versioned.NotFoundError
	require.ErrorAs(t, err, &nf)
	require.ErrorIs(t, err, versioned.ErrNotFound)
	require.Equal(t, "nope", nf.ID)
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &account{ID: "a1", Owner: "ana", Balance: 10, Note: "hi"}))

	mine, err := repo.Get(b.ctx, "a1")
	require.NoError(t, err)
	theirs, err := repo.Get(b.ctx, "a1")
	require.NoError(t, err)
	v0 := mine.Version

	mine.Balance = 20
	mine.Note = "" // omitempty: the field is removed
	require.NoError(t, repo.Update(b.ctx, mine))
	require.Equal(t, v0+1, mine.Version)
	m := b.raw(t, "a1")
	require.Equal(t, int64(20), m["balance"])
	require.NotContains(t, m, "note", "a mapped field the copy omits is $unset")

	theirs.Balance = 99
	err = repo.Update(b.ctx, theirs)
	var ce *versioned.ConflictError
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, err, versioned.ErrConflict)
	require.NotErrorIs(t, err, versioned.ErrNotFound)
	require.Equal(t, versioned.ConflictError{Op: "update", ID: "a1", Expected: v0, Current: v0 + 1}, *ce)
	require.True(t, retry.IsRetryable(err), "a conflict is retryable")
	require.Equal(t, v0, theirs.Version, "a failed update leaves the copy alone")
	require.Equal(t, int64(20), b.raw(t, "a1")["balance"])

	_, err = b.coll.DeleteOne(b.ctx, bson.M{"_id": "a1"})
	require.NoError(t, err)
	err = repo.Update(b.ctx, mine)
	require.ErrorIs(t, err, versioned.ErrNotFound)
	require.NotErrorIs(t, err, versioned.ErrConflict)
}

func TestDelete(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	a := &account{ID: "a1", Owner: "ana"}
	require.NoError(t, repo.Insert(b.ctx, a))
	stale := *a
	a.Balance = 5
	require.NoError(t, repo.Update(b.ctx, a))

	err := repo.Delete(b.ctx, &stale)
	require.ErrorIs(t, err, versioned.ErrConflict)
	require.Equal(t, int64(1), b.count(t), "a stale delete removes nothing")

	require.NoError(t, repo.Delete(b.ctx, a))
	require.Equal(t, int64(0), b.count(t))
	require.ErrorIs(t, repo.Delete(b.ctx, a), versioned.ErrNotFound)
}

func TestModify(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	ins := &account{ID: "a1", Owner: "ana", Balance: 10, Tags: []string{"a"}}
	require.NoError(t, repo.Insert(b.ctx, ins))
	v0 := ins.Version

	got, err := repo.Modify(b.ctx, "a1", func(a *account) error {
		a.Balance += 5
		a.Tags = nil // removed: $unset
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(15), got.Balance)
	require.Equal(t, v0+1, got.Version)
	m := b.raw(t, "a1")
	require.Equal(t, int64(15), m["balance"])
	require.Equal(t, v0+1, m["version"])
	require.NotContains(t, m, "tags")

	t.Run("fn error aborts without a write", func(t *testing.T) {
		errNo := errors.New("insufficient funds")
		before := b.rawBytes(t, "a1")
		_, err := repo.Modify(b.ctx, "a1", func(a *account) error {
			a.Balance = -1
			return fmt.Errorf("check: %w", errNo)
		})
		require.ErrorIs(t, err, errNo)
		require.Contains(t, err.Error(), "versioned: modify a1: fn: check: insufficient funds")
		require.Equal(t, before, b.rawBytes(t, "a1"))
	})

	t.Run("no change writes nothing", func(t *testing.T) {
		before := b.rawBytes(t, "a1")
		got, err := repo.Modify(b.ctx, "a1", func(a *account) error { return nil })
		require.NoError(t, err)
		require.Equal(t, v0+1, got.Version)
		require.Equal(t, before, b.rawBytes(t, "a1"))
	})

	t.Run("fn may not change the id", func(t *testing.T) {
		before := b.rawBytes(t, "a1")
		_, err := repo.Modify(b.ctx, "a1", func(a *account) error { a.ID = "a2"; return nil })
		require.ErrorIs(t, err, versioned.ErrInvalid)
		require.Equal(t, before, b.rawBytes(t, "a1"))
		require.Equal(t, int64(1), b.count(t))
	})

	t.Run("not found", func(t *testing.T) {
		called := false
		_, err := repo.Modify(b.ctx, "zz", func(a *account) error { called = true; return nil })
		require.ErrorIs(t, err, versioned.ErrNotFound)
		require.False(t, called)
	})

	t.Run("conflicts are retried on fresh state", func(t *testing.T) {
		calls := 0
		got, err := repo.Modify(b.ctx, "a1", func(a *account) error {
			calls++
			if calls == 1 {
				// Another writer gets in between this read and its write.
				_, err := b.coll.UpdateOne(b.ctx, bson.M{"_id": "a1"}, bson.M{"$inc": bson.M{"balance": 100, "version": 1}})
				require.NoError(t, err)
			}
			a.Balance++
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 2, calls)
		require.Equal(t, int64(116), got.Balance, "the retry saw the other writer's +100")
		require.Equal(t, int64(116), b.raw(t, "a1")["balance"])
	})

	t.Run("retries run out", func(t *testing.T) {
		var retries []retry.Attempt
		p := retry.Policy{MaxAttempts: 3, InitialInterval: 1, MaxInterval: 1, OnRetry: func(a retry.Attempt) { retries = append(retries, a) }}
		_, err := repo.Modify(b.ctx, "a1", func(a *account) error {
			_, err := b.coll.UpdateOne(b.ctx, bson.M{"_id": "a1"}, bson.M{"$inc": bson.M{"version": 1}})
			require.NoError(t, err)
			a.Balance++
			return nil
		}, versioned.WithRetry(p))
		require.ErrorIs(t, err, versioned.ErrConflict)
		require.ErrorIs(t, err, retry.ErrExhausted)
		var ce *versioned.ConflictError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, ce.Expected+1, ce.Current)
		require.Len(t, retries, 2)
		require.Equal(t, int64(116), b.raw(t, "a1")["balance"], "no attempt wrote")
		first, ok := errors.AsType[*versioned.ConflictError](retries[0].Err)
		require.True(t, ok)
		if b.db.Server.Caps.UpdatePipelines {
			require.Equal(t, first.Expected+1, first.Current, "the write returned the current document: no re-read")
		} else {
			require.Equal(t, int64(-1), first.Current, "a conflict is not re-read before a retry")
		}
	})

	t.Run("the retry budget caps retries", func(t *testing.T) {
		p := retry.Policy{Budget: retry.NewBudget(0, 1), InitialInterval: 1, MaxInterval: 1} // one retry, ever
		calls := 0
		_, err := repo.Modify(b.ctx, "a1", func(a *account) error {
			calls++
			_, err := b.coll.UpdateOne(b.ctx, bson.M{"_id": "a1"}, bson.M{"$inc": bson.M{"version": 1}})
			require.NoError(t, err)
			a.Balance++
			return nil
		}, versioned.WithRetry(p))
		require.ErrorIs(t, err, retry.ErrBudgetExhausted)
		require.ErrorIs(t, err, versioned.ErrConflict)
		require.Equal(t, 2, calls)
		require.Equal(t, int64(116), b.raw(t, "a1")["balance"])
	})
}

func TestGuarded(t *testing.T) {
	t.Parallel()
	repo, b := setup[item](t, nil)
	ins := &item{SKU: "sku1", Stock: 5}
	require.NoError(t, repo.Insert(b.ctx, ins))
	v0 := ins.Version

	got, err := repo.Guarded(b.ctx, "sku1", bson.M{"stock": bson.M{"$gte": 3}}, bson.M{"$inc": bson.M{"stock": -3}})
	require.NoError(t, err)
	require.Equal(t, &item{SKU: "sku1", Stock: 2, Version: v0 + 1}, got)

	_, err = repo.Guarded(b.ctx, "sku1", bson.M{"stock": bson.M{"$gte": 3}}, bson.M{"$inc": bson.M{"stock": -3}})
	var ge *versioned.GuardError
	require.ErrorAs(t, err, &ge)
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	require.NotErrorIs(t, err, versioned.ErrNotFound)
	require.Equal(t, v0+1, ge.Version)
	require.Equal(t, int64(2), b.raw(t, "sku1")["stock"])

	_, err = repo.Guarded(b.ctx, "nope", bson.M{"stock": bson.M{"$gte": 3}}, bson.M{"$inc": bson.M{"stock": -3}})
	require.ErrorIs(t, err, versioned.ErrNotFound)
	require.NotErrorIs(t, err, versioned.ErrGuardFailed)

	// No condition: an atomic increment that still bumps the version.
	got, err = repo.Guarded(b.ctx, "sku1", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: 10}}}, {Key: "$currentDate", Value: bson.M{"restockedAt": true}}})
	require.NoError(t, err)
	require.Equal(t, int64(12), got.Stock)
	require.Equal(t, v0+2, got.Version)
	require.Contains(t, b.raw(t, "sku1"), "restockedAt")

	// A Guarded write and a held copy: the copy now conflicts.
	held, err := repo.Get(b.ctx, "sku1")
	require.NoError(t, err)
	_, err = repo.Guarded(b.ctx, "sku1", nil, bson.M{"$inc": bson.M{"stock": -1}})
	require.NoError(t, err)
	held.Stock = 1000
	require.ErrorIs(t, repo.Update(b.ctx, held), versioned.ErrConflict)
}

func TestGuardedStaleBase(t *testing.T) {
	t.Parallel()
	// Two repositories: b's many writes push the write id a last saw (its
	// anchor) out of the document, so a's next Guarded must read and send
	// again.
	a, b := setup[item](t, nil)
	other, err := versioned.New[item](b.coll, nil)
	require.NoError(t, err)
	ins := &item{SKU: "s", Stock: 100}
	require.NoError(t, a.Insert(b.ctx, ins))
	_, err = a.Guarded(b.ctx, "s", nil, bson.M{"$inc": bson.M{"stock": -1}})
	require.NoError(t, err)
	const others = versioned.WriteIDs + 3
	for range others {
		_, err = other.Modify(b.ctx, "s", func(i *item) error { i.Stock--; return nil })
		require.NoError(t, err)
	}
	got, err := a.Guarded(b.ctx, "s", bson.M{"stock": bson.M{"$gte": 1}}, bson.M{"$inc": bson.M{"stock": -1}})
	require.NoError(t, err)
	require.Equal(t, int64(100-2-others), got.Stock)
	require.Equal(t, ins.Version+2+others, got.Version)
}

func TestUnmappedFieldsSurvive(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	ins := &account{ID: "a1", Owner: "ana", Balance: 10}
	require.NoError(t, repo.Insert(b.ctx, ins))

	lease := bson.M{"owner": "worker-7", "epoch": int64(3)}
	setLease := func(epoch int64) {
		lease["epoch"] = epoch
		// Another service's raw write, without a version bump.
		_, err := b.coll.UpdateOne(b.ctx, bson.M{"_id": "a1"}, bson.M{"$set": bson.M{"lease": lease, "audit.by": "svc", "score": epoch * 10}})
		require.NoError(t, err)
	}
	check := func(epoch int64) {
		t.Helper()
		m := b.raw(t, "a1")
		require.Equal(t, bson.M{"owner": "worker-7", "epoch": epoch}, m["lease"])
		require.Equal(t, bson.M{"by": "svc"}, m["audit"])
		require.Equal(t, epoch*10, m["score"])
	}

	setLease(3)
	held, err := repo.Get(b.ctx, "a1")
	require.NoError(t, err)
	setLease(4) // written between Get and Update
	held.Balance = 11
	require.NoError(t, repo.Update(b.ctx, held))
	check(4)

	_, err = repo.Modify(b.ctx, "a1", func(a *account) error { a.Balance++; a.Note = "n"; return nil })
	require.NoError(t, err)
	check(4)

	setLease(5)
	_, err = repo.Guarded(b.ctx, "a1", bson.M{"balance": bson.M{"$gte": 1}}, bson.M{"$inc": bson.M{"balance": -1}, "$set": bson.M{"note": "g"}})
	require.NoError(t, err)
	check(5)

	held, err = repo.Get(b.ctx, "a1")
	require.NoError(t, err)
	held.Note = ""
	require.NoError(t, repo.Update(b.ctx, held))
	check(5)
	m := b.raw(t, "a1")
	require.Equal(t, int64(11), m["balance"])
	require.NotContains(t, m, "note")
	require.Equal(t, ins.Version+4, m["version"])
}

func TestLegacyDocumentsAreVersionZero(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	// Written before the library was adopted: no version field, int32s.
	_, err := b.coll.InsertMany(b.ctx, []any{
		bson.M{"_id": "old1", "owner": "ana", "balance": int32(10)},
		bson.M{"_id": "old2", "owner": "bob", "balance": int32(10)},
		bson.M{"_id": "old3", "owner": "cid", "balance": 10.0, "version": 2.0}, // as mongosh writes numbers
	})
	require.NoError(t, err)

	a, err := repo.Get(b.ctx, "old1")
	require.NoError(t, err)
	require.Equal(t, int64(0), a.Version)
	a.Balance = 20
	require.NoError(t, repo.Update(b.ctx, a))
	require.Equal(t, int64(1), a.Version)
	require.Equal(t, int64(1), b.raw(t, "old1")["version"])

	got, err := repo.Modify(b.ctx, "old2", func(a *account) error { a.Balance++; return nil })
	require.NoError(t, err)
	require.Equal(t, int64(1), got.Version)

	got, err = repo.Guarded(b.ctx, "old3", nil, bson.M{"$inc": bson.M{"balance": 1}})
	require.NoError(t, err)
	require.Equal(t, int64(3), got.Version)
	require.Equal(t, int64(11), got.Balance)

	require.NoError(t, b.coll.Drop(b.ctx))
	_, err = b.coll.InsertOne(b.ctx, bson.M{"_id": "old4", "stock": 1})
	require.NoError(t, err)
	items, err := versioned.New[item](b.coll, nil)
	require.NoError(t, err)
	it, err := items.Guarded(b.ctx, "old4", bson.M{"stock": bson.M{"$gte": 1}}, bson.M{"$inc": bson.M{"stock": -1}})
	require.NoError(t, err)
	require.Equal(t, &item{SKU: "old4", Stock: 0, Version: 1}, it)
}

func TestWhere(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &account{ID: "a1", Balance: 10}))
	_, err := b.coll.UpdateOne(b.ctx, bson.M{"_id": "a1"}, bson.M{"$set": bson.M{"lease": bson.M{"owner": "me", "epoch": 1}}})
	require.NoError(t, err)
	errLost := errors.New("lease lost")
	mine := versioned.WhereErr(bson.D{{Key: "lease.owner", Value: "me"}, {Key: "lease.epoch", Value: 1}}, errLost)
	theirs := versioned.WhereErr(bson.D{{Key: "lease.owner", Value: "you"}}, errLost)

	a, err := repo.Get(b.ctx, "a1")
	require.NoError(t, err)
	a.Balance = 11
	v0 := a.Version
	require.NoError(t, repo.Update(b.ctx, a, mine))
	require.Equal(t, v0+1, a.Version)

	a.Balance = 12
	err = repo.Update(b.ctx, a, theirs)
	var ge *versioned.GuardError
	require.ErrorAs(t, err, &ge)
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	require.ErrorIs(t, err, errLost)
	require.Equal(t, v0+1, ge.Version)
	require.Equal(t, v0+1, a.Version)

	// Several conditions: the one that fails gives its error.
	errOther := errors.New("other")
	err = repo.Update(b.ctx, a, versioned.WhereErr(bson.D{{Key: "balance", Value: 11}}, errOther), theirs)
	require.ErrorIs(t, err, errLost)
	require.NotErrorIs(t, err, errOther)

	// Plain Where: a GuardError without a cause.
	err = repo.Update(b.ctx, a, versioned.Where(bson.D{{Key: "balance", Value: bson.M{"$gt": 100}}}))
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	require.ErrorAs(t, err, &ge)
	require.NoError(t, ge.Err)

	called := false
	_, err = repo.Modify(b.ctx, "a1", func(a *account) error { called = true; return nil }, theirs)
	require.ErrorIs(t, err, errLost)
	require.False(t, called, "fn is not called on a document that fails the filter")
	got, err := repo.Modify(b.ctx, "a1", func(a *account) error { a.Balance = 50; return nil }, mine)
	require.NoError(t, err)
	require.Equal(t, int64(50), got.Balance)

	_, err = repo.Guarded(b.ctx, "a1", nil, bson.M{"$inc": bson.M{"balance": 1}}, theirs)
	require.ErrorIs(t, err, errLost)
	_, err = repo.Guarded(b.ctx, "a1", bson.M{"balance": bson.M{"$gte": 1000}}, bson.M{"$inc": bson.M{"balance": 1}}, mine)
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	require.NotErrorIs(t, err, errLost, "the cond failed, not the lease filter")

	require.ErrorIs(t, repo.Delete(b.ctx, got, theirs), errLost)
	require.NoError(t, repo.Delete(b.ctx, got, mine))
	require.Equal(t, int64(0), b.count(t))
}

func TestUniqueIndexViolation(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	_, err := b.coll.Indexes().CreateOne(b.ctx, mongo.IndexModel{Keys: bson.D{{Key: "owner", Value: 1}}, Options: options.Index().SetUnique(true)})
	require.NoError(t, err)
	require.NoError(t, repo.Insert(b.ctx, &account{ID: "a1", Owner: "ana"}))
	bob := &account{ID: "a2", Owner: "bob"}
	require.NoError(t, repo.Insert(b.ctx, bob))
	v0 := bob.Version

	check := func(err error) {
		t.Helper()
		require.ErrorIs(t, err, versioned.ErrDuplicate)
		// The driver's error stays reachable: a WriteException from
		// insert and update, a CommandError from findAndModify (Guarded).
		var se mongo.ServerError
		require.ErrorAs(t, err, &se)
		require.Equal(t, 1, strings.Count(err.Error(), "versioned: "), err.Error())
	}
	check(repo.Insert(b.ctx, &account{ID: "a3", Owner: "ana"}))
	if b.db.Caps().Server == store.FerretDBv1 {
		// FerretDB v1 reports a unique index violation by an update as an
		// InternalError, not as a duplicate key (code 11000): only check
		// that nothing was written.
		check = func(err error) { t.Helper(); require.Error(t, err) }
	}
	bob.Owner = "ana"
	check(repo.Update(b.ctx, bob))
	_, err = repo.Modify(b.ctx, "a2", func(a *account) error { a.Owner = "ana"; return nil })
	check(err)
	_, err = repo.Guarded(b.ctx, "a2", nil, bson.M{"$set": bson.M{"owner": "ana"}})
	check(err)
	require.Equal(t, "bob", b.raw(t, "a2")["owner"])
	require.Equal(t, v0, bob.Version)
	require.Equal(t, int64(2), b.count(t))
}

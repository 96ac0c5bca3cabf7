package versioned_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// TestInvalidInput checks that each kind of bad input gets an error
// matching ErrInvalid, of type *InvalidError, and that nothing is written.
func TestInvalidInput(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	good := &account{ID: "a1", Owner: "ana", Balance: 10}
	require.NoError(t, repo.Insert(b.ctx, good))
	before := b.rawBytes(t, "a1")
	anyRepo, err := versioned.New[anyID](b.coll, nil)
	require.NoError(t, err)
	inc := bson.M{"$inc": bson.M{"balance": 1}}
	bump := func(a *account) error { a.Balance++; return nil }
	withAttrs := func(attrs map[string]string) *account {
		c := *good
		c.Attrs = attrs
		return &c
	}
	big := *good
	big.Note = strings.Repeat("x", 17<<20)

	cases := []struct {
		name  string
		call  func() error
		field string
	}{
		{"nil document insert", func() error { return repo.Insert(b.ctx, nil) }, ""},
		{"nil document update", func() error { return repo.Update(b.ctx, nil) }, ""},
		{"nil document delete", func() error { return repo.Delete(b.ctx, nil) }, ""},
		{"nil id get", func() error { _, err := repo.Get(b.ctx, nil); return err }, "_id"},
		{"empty id get", func() error { _, err := repo.Get(b.ctx, ""); return err }, "_id"},
		{"empty id insert", func() error { return repo.Insert(b.ctx, &account{Owner: "x"}) }, "_id"},
		{"empty id update", func() error { return repo.Update(b.ctx, &account{Owner: "x"}) }, "_id"},
		{"wrong id type get", func() error { _, err := repo.Get(b.ctx, 17); return err }, "_id"},
		{"wrong id type modify", func() error { _, err := repo.Modify(b.ctx, bson.NewObjectID(), bump); return err }, "_id"},
		{"wrong id type guarded", func() error { _, err := repo.Guarded(b.ctx, []byte("a1"), nil, inc); return err }, "_id"},
		{"nil fn", func() error { _, err := repo.Modify(b.ctx, "a1", nil); return err }, ""},
		{"negative version update", func() error { c := *good; c.Version = -1; return repo.Update(b.ctx, &c) }, "version"},
		{"negative version delete", func() error { c := *good; c.Version = -1; return repo.Delete(b.ctx, &c) }, "version"},
		{"$ key insert", func() error {
			c := withAttrs(map[string]string{"$where": "1"})
			c.ID = "a2"
			return repo.Insert(b.ctx, c)
		}, "attrs.$where"},
		{"dotted key update", func() error { return repo.Update(b.ctx, withAttrs(map[string]string{"a.b": "1"})) }, "attrs.a.b"},
		{"$ key from fn", func() error {
			_, err := repo.Modify(b.ctx, "a1", func(a *account) error { a.Attrs = map[string]string{"ok": "1", "$set": "x"}; return nil })
			return err
		}, "attrs.$set"},
		{"dotted key in guarded $set", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$set": bson.M{"attrs": bson.M{"x.y": 1}}})
			return err
		}, "attrs.x.y"},
		{"nested $ key in an array in guarded $set", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$set": bson.M{"list": bson.A{bson.M{"ok": 1}, bson.M{"$gt": 1}}}})
			return err
		}, "list.1.$gt"},
		{"document over 16 MiB", func() error { c := big; return repo.Update(b.ctx, &c) }, ""},
		{"document over 16 MiB from fn", func() error {
			_, err := repo.Modify(b.ctx, "a1", func(a *account) error { a.Note = big.Note; return nil })
			return err
		}, ""},
		{"guarded touches the reserved lease field", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$inc": bson.M{"_lease.epoch": -5}})
			return err
		}, "_lease.epoch"},
		{"guarded sets more than 16 MiB", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$set": bson.M{"note": big.Note}})
			return err
		}, "update"},
		{"operator-shaped id get", func() error { _, err := anyRepo.Get(b.ctx, map[string]any{"$ne": "x"}); return err }, "_id"},
		{"regex id delete", func() error { return anyRepo.Delete(b.ctx, &anyID{ID: bson.Regex{Pattern: ".*"}, Version: 1}) }, "_id"},
		{"nested operator id guarded", func() error {
			_, err := anyRepo.Guarded(b.ctx, bson.D{{Key: "a", Value: bson.D{{Key: "$gt", Value: ""}}}}, nil, inc)
			return err
		}, "_id"},
		{"nil context", func() error { _, err := repo.Get(nil, "a1"); return err }, ""}, //nolint:staticcheck // testing the refusal of a nil context
		{"guarded nil update", func() error { _, err := repo.Guarded(b.ctx, "a1", nil, nil); return err }, "update"},
		{"guarded empty update", func() error { _, err := repo.Guarded(b.ctx, "a1", nil, bson.M{}); return err }, "update"},
		{"guarded operator not allowed", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$rename": bson.M{"balance": "b"}})
			return err
		}, "$rename"},
		{"guarded $setOnInsert", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$setOnInsert": bson.M{"balance": 1}})
			return err
		}, "$setOnInsert"},
		{"guarded replacement document", func() error { _, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"balance": 1}); return err }, "balance"},
		{"guarded touches version", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$inc": bson.M{"version": 1}})
			return err
		}, "version"},
		{"guarded touches _id", func() error { _, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$set": bson.M{"_id": "x"}}); return err }, "_id"},
		{"guarded touches write ids", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$unset": bson.M{"_mc.w": ""}})
			return err
		}, "_mc.w"},
		{"guarded positional path", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$set": bson.M{"tags.$": "x"}})
			return err
		}, "tags.$"},
		{"guarded empty path segment", func() error { _, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$set": bson.M{"a..b": 1}}); return err }, "a..b"},
		{"guarded overlapping paths", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.D{{Key: "$set", Value: bson.M{"attrs.x": "1"}}, {Key: "$unset", Value: bson.M{"attrs": ""}}})
			return err
		}, "attrs"},
		{"guarded $inc of a string", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$inc": bson.M{"balance": "1"}})
			return err
		}, "balance"},
		{"guarded bad $currentDate", func() error {
			_, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$currentDate": bson.M{"at": "now"}})
			return err
		}, "at"},
		{"guarded operator with no fields", func() error { _, err := repo.Guarded(b.ctx, "a1", nil, bson.M{"$set": bson.M{}}); return err }, "$set"},
		{"guarded cond not a document", func() error { _, err := repo.Guarded(b.ctx, "a1", "stock > 1", inc); return err }, "cond"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			require.ErrorIs(t, err, versioned.ErrInvalid)
			var ie *versioned.InvalidError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, c.field, ie.Field)
			require.True(t, strings.HasPrefix(err.Error(), "versioned: "), err.Error())
			require.False(t, retry.IsRetryable(err))
			require.Equal(t, before, b.rawBytes(t, "a1"), "nothing was written")
			require.Equal(t, int64(1), b.count(t), "nothing was inserted")
		})
	}
}

func TestVersionOfWrongTypeInDatabase(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	_, err := b.coll.InsertMany(b.ctx, []any{
		bson.M{"_id": "s", "balance": 1, "version": "7"},
		bson.M{"_id": "f", "balance": 1, "version": 1.5},
		bson.M{"_id": "n", "balance": 1, "version": int64(-3)},
		bson.M{"_id": "z", "balance": 1, "version": nil},
	})
	require.NoError(t, err)
	for _, id := range []string{"s", "f", "n", "z"} {
		t.Run(id, func(t *testing.T) {
			before := b.rawBytes(t, id)
			check := func(err error) {
				t.Helper()
				require.ErrorIs(t, err, versioned.ErrInvalid)
				var ve *versioned.VersionTypeError
				require.ErrorAs(t, err, &ve)
				require.Equal(t, id, ve.ID)
				require.Equal(t, "version", ve.Field)
				require.Equal(t, before, b.rawBytes(t, id), "nothing was written")
			}
			_, err := repo.Get(b.ctx, id)
			check(err)
			check(repo.Update(b.ctx, &account{ID: id, Balance: 5}))
			check(repo.Delete(b.ctx, &account{ID: id}))
			_, err = repo.Modify(b.ctx, id, func(a *account) error { a.Balance = 5; return nil })
			check(err)
			_, err = repo.Guarded(b.ctx, id, nil, bson.M{"$inc": bson.M{"balance": 1}})
			check(err)
		})
	}
}

func TestDollarStringValuesAreStoredLiterally(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	a := &account{ID: "$inc", Owner: "$set", Note: "{$gt: 1}", Tags: []string{"$unset", "$where"}, Attrs: map[string]string{"k": "$rename"}}
	require.NoError(t, repo.Insert(b.ctx, a))
	a.Owner = "$inc"
	require.NoError(t, repo.Update(b.ctx, a))
	_, err := repo.Modify(b.ctx, "$inc", func(x *account) error { x.Note = "$$ROOT"; return nil })
	require.NoError(t, err)
	got, err := repo.Guarded(b.ctx, "$inc", bson.M{"owner": "$inc"}, bson.M{"$set": bson.M{"attrs.k": "$currentDate"}})
	require.NoError(t, err)
	want := &account{ID: "$inc", Owner: "$inc", Note: "$$ROOT", Tags: []string{"$unset", "$where"}, Attrs: map[string]string{"k": "$currentDate"}, Version: a.Version + 2}
	require.Equal(t, want, got)
	m := b.raw(t, "$inc")
	require.Equal(t, "$inc", m["owner"])
	require.Equal(t, "$$ROOT", m["note"])
	require.Equal(t, bson.M{"k": "$currentDate"}, m["attrs"])
}

func TestNewRejectsUnusableTypes(t *testing.T) {
	t.Parallel()
	_, b := setup[account](t, nil)
	type noID struct {
		Version int64 `bson:"version"`
	}
	type noVersion struct {
		ID string `bson:"_id"`
	}
	type intVersion struct {
		ID      string `bson:"_id"`
		Version int    `bson:"version"`
	}
	type inlineMap struct {
		ID      string         `bson:"_id"`
		Version int64          `bson:"version"`
		Rest    map[string]any `bson:",inline"`
	}
	type dottedTag struct {
		ID      string `bson:"_id"`
		Version int64  `bson:"version"`
		X       int    `bson:"a.b"`
	}
	type mapsMeta struct {
		ID      string `bson:"_id"`
		Version int64  `bson:"version"`
		Meta    bson.M `bson:"_mc"`
	}
	type Base struct {
		ID      string `bson:"_id"`
		Version int64  `bson:"rev"`
	}
	type embedded struct {
		Base  `bson:",inline"`
		Stock int64 `bson:"stock"`
	}
	for name, err := range map[string]error{
		"no id":            errOf(versioned.New[noID](b.coll, nil)),
		"no version":       errOf(versioned.New[noVersion](b.coll, nil)),
		"int version":      errOf(versioned.New[intVersion](b.coll, nil)),
		"inline map":       errOf(versioned.New[inlineMap](b.coll, nil)),
		"dotted tag":       errOf(versioned.New[dottedTag](b.coll, nil)),
		"maps meta field":  errOf(versioned.New[mapsMeta](b.coll, nil)),
		"not a struct":     errOf(versioned.New[map[string]any](b.coll, nil)),
		"nil collection":   errOf(versioned.New[account](nil, nil)),
		"reserved _id":     errOf(versioned.New[account](b.coll, &versioned.Options{Reserved: []string{"_id"}})),
		"reserved dotted":  errOf(versioned.New[account](b.coll, &versioned.Options{Reserved: []string{"a.b"}})),
		"dollar version":   errOf(versioned.New[account](b.coll, &versioned.Options{VersionField: "$v"})),
		"same fields":      errOf(versioned.New[account](b.coll, &versioned.Options{VersionField: "v", MetaField: "v"})),
		"bad retry policy": errOf(versioned.New[account](b.coll, &versioned.Options{Retry: retry.Policy{Multiplier: 0.5}})),
	} {
		require.ErrorIs(t, err, versioned.ErrInvalid, name)
	}

	// An inline embedded struct and a renamed version field work.
	repo, err := versioned.New[embedded](b.coll, &versioned.Options{VersionField: "rev"})
	require.NoError(t, err)
	e := &embedded{Base: Base{ID: "e1"}, Stock: 3}
	require.NoError(t, repo.Insert(b.ctx, e))
	require.Equal(t, e.Version, b.raw(t, "e1")["rev"])
	got, err := repo.Guarded(b.ctx, "e1", bson.M{"stock": bson.M{"$gte": 1}}, bson.M{"$inc": bson.M{"stock": -1}})
	require.NoError(t, err)
	require.Equal(t, &embedded{Base: Base{ID: "e1", Version: e.Version + 1}, Stock: 2}, got)
	require.Equal(t, e.Version+1, b.raw(t, "e1")["rev"])
}

func errOf[T any](_ T, err error) error { return err }

func TestIntegerIDsConvert(t *testing.T) {
	t.Parallel()
	type row struct {
		ID      int64 `bson:"_id"`
		N       int   `bson:"n"`
		Version int64 `bson:"version"`
	}
	repo, b := setup[row](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &row{ID: 7}))
	got, err := repo.Get(b.ctx, 7) // an untyped constant is an int
	require.NoError(t, err)
	require.Equal(t, int64(7), got.ID)
	_, err = repo.Get(b.ctx, uint8(7))
	require.NoError(t, err)
	_, err = repo.Get(b.ctx, uint64(1<<63))
	require.ErrorIs(t, err, versioned.ErrInvalid, "a value that does not fit is refused")
	_, err = repo.Get(b.ctx, "7")
	require.ErrorIs(t, err, versioned.ErrInvalid)
}

// A context that ended before the call is the context's error, wrapped,
// never ErrInvalid: a service must not answer 400 to a client that hung up.
// Nothing is sent.
func TestEndedContextIsTheContextError(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	good := &account{ID: "a1", Owner: "ana", Balance: 10}
	require.NoError(t, repo.Insert(b.ctx, good))
	before := b.rawBytes(t, "a1")
	cancelled, cancel := context.WithCancelCause(b.ctx)
	cause := errors.New("client hung up")
	cancel(cause)
	expired, cancel2 := context.WithDeadline(b.ctx, time.Now().Add(-time.Second))
	defer cancel2()
	inc := bson.M{"$inc": bson.M{"balance": 1}}
	for name, call := range map[string]func(ctx context.Context) error{
		"get":    func(ctx context.Context) error { _, err := repo.Get(ctx, "a1"); return err },
		"insert": func(ctx context.Context) error { return repo.Insert(ctx, &account{ID: "new"}) },
		"update": func(ctx context.Context) error { c := *good; c.Balance = 99; return repo.Update(ctx, &c) },
		"delete": func(ctx context.Context) error { c := *good; return repo.Delete(ctx, &c) },
		"modify": func(ctx context.Context) error {
			_, err := repo.Modify(ctx, "a1", func(a *account) error { a.Balance++; return nil })
			return err
		},
		"guarded": func(ctx context.Context) error { _, err := repo.Guarded(ctx, "a1", nil, inc); return err },
	} {
		err := call(cancelled)
		require.ErrorIs(t, err, context.Canceled, name)
		require.ErrorIs(t, err, cause, name)
		require.NotErrorIs(t, err, versioned.ErrInvalid, name)
		require.True(t, strings.HasPrefix(err.Error(), "versioned: "+name+": "), err.Error())
		err = call(expired)
		require.ErrorIs(t, err, context.DeadlineExceeded, name)
		require.NotErrorIs(t, err, versioned.ErrInvalid, name)
	}
	require.Equal(t, before, b.rawBytes(t, "a1"), "nothing was written")
	require.Equal(t, int64(1), b.count(t))
}

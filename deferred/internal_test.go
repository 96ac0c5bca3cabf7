package deferred

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/retry"
)

// queue returns a Queue on a collection of a client that never connects:
// enough for the code that sends nothing.
func queue(t *testing.T, opts *Options) *Queue {
	t.Helper()
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(t.Context()) })
	q, err := New(client.Database("db").Collection("jobs"), opts)
	require.NoError(t, err)
	return q
}

func TestOptions(t *testing.T) {
	t.Parallel()
	c, err := (*Options)(nil).config()
	require.NoError(t, err)
	require.Equal(t, DefaultWorkers, c.Workers)
	require.Equal(t, DefaultVisibilityTimeout, c.VisibilityTimeout)
	require.Equal(t, DefaultMaxAttempts, c.MaxAttempts)
	require.Equal(t, time.Second, c.Backoff.InitialInterval)
	require.Equal(t, DefaultFenceField, c.FenceField)
	for _, bad := range []Options{
		{Workers: -1}, {MaxAttempts: -1}, {Batch: -1}, {MaxStamps: -1}, {VisibilityTimeout: -1}, {PollInterval: -1},
		{HoleTimeout: -1}, {Retention: -1}, {ResolveTimeout: -1}, {FenceField: "$x"}, {FenceField: "a.b"},
		{Owner: "  "}, {Backoff: retry.Policy{Multiplier: 0.5}}, {Retry: retry.Policy{MaxInterval: -1}},
	} {
		_, err := bad.config()
		require.ErrorIs(t, err, ErrInvalid, "%+v", bad)
		require.True(t, strings.HasPrefix(err.Error(), "deferred: new: invalid "), err.Error())
	}
}

func TestCheckArgs(t *testing.T) {
	t.Parallel()
	enc := func(v any) bson.RawValue {
		typ, b, err := bson.MarshalValue(v)
		require.NoError(t, err)
		return bson.RawValue{Type: typ, Value: b}
	}
	for _, ok := range []any{1, "x", bson.D{{Key: "a", Value: 1}}, bson.A{bson.D{{Key: "b", Value: "$c"}}}, struct{ A int }{1}} {
		require.NoError(t, checkArgs(enc(ok)), "%v", ok)
	}
	for _, bad := range []any{
		bson.D{{Key: "$set", Value: 1}},
		bson.D{{Key: "a", Value: bson.D{{Key: "$gt", Value: 1}}}},
		bson.A{bson.D{{Key: "a.b", Value: 1}}},
		map[string]int{"$where": 1},
	} {
		require.Error(t, checkArgs(enc(bad)), "%v", bad)
	}
	deep := bson.D{{Key: "a", Value: 1}}
	for range 120 {
		deep = bson.D{{Key: "a", Value: deep}}
	}
	require.Error(t, checkArgs(enc(deep)))
}

func TestFenceAndStamp(t *testing.T) {
	t.Parallel()
	q := queue(t, nil)
	key := func(v any) bson.RawValue {
		typ, b, err := bson.MarshalValue(v)
		require.NoError(t, err)
		return bson.RawValue{Type: typ, Value: b}
	}
	j := &Job{Key: key("ana"), Seq: 42, q: q}
	f := j.FenceField()
	require.True(t, strings.HasPrefix(f, "_deferred.k"), f)
	require.NotContains(t, strings.TrimPrefix(f, "_deferred."), ".")
	require.Equal(t, f, (&Job{Key: key("ana"), Seq: 1, q: q}).FenceField(), "one field per key")
	require.NotEqual(t, f, (&Job{Key: key("bob"), q: q}).FenceField())
	require.NotEqual(t, f, (&Job{Key: key(bson.D{{Key: "s", Value: "ana"}}), q: q}).FenceField(), "the type counts")
	require.Equal(t, bson.E{Key: f, Value: int64(42)}, j.Stamp())
	require.Equal(t, bson.D{{Key: f, Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gte", Value: int64(42)}}}}}}, j.Fence())

	stamped := func(n int64) bson.Raw {
		raw, err := bson.Marshal(bson.D{{Key: "_id", Value: "ana"}, {Key: "_deferred", Value: bson.D{{Key: strings.TrimPrefix(f, "_deferred."), Value: n}}}})
		require.NoError(t, err)
		return raw
	}
	require.True(t, j.AppliedTo(stamped(42)))
	require.True(t, j.AppliedTo(stamped(43)), "a later job of the key applied")
	require.False(t, j.AppliedTo(stamped(41)))
	require.False(t, j.AppliedTo(stamped(0)[:0]))

}

func TestErrors(t *testing.T) {
	t.Parallel()
	id := bson.NewObjectID()
	require.ErrorIs(t, &NotFoundError{ID: id}, ErrNotFound)
	require.ErrorIs(t, &StateError{Op: "cancel", ID: id, State: StateRunning}, ErrState)
	ue := &UnknownOutcomeError{Pkg: "deferred", Op: "enqueue", ID: id, Subject: "job " + id.Hex(), Err: errors.New("eof")}
	require.ErrorIs(t, ue, ErrUnknownOutcome)
	require.False(t, retry.IsRetryable(ue))
	ie := invalid("enqueue", "key", "refused", nil)
	require.ErrorIs(t, ie, ErrInvalidID)
	require.NotErrorIs(t, invalid("enqueue", "args", "x", nil), ErrInvalidID)
	for _, err := range []error{&NotFoundError{ID: id}, &StateError{Op: "cancel", ID: id}, ue, ie, &PanicError{Value: 1}} {
		require.Equal(t, 1, strings.Count(err.Error(), "deferred: "), err.Error())
	}
}

func TestDelay(t *testing.T) {
	t.Parallel()
	q := queue(t, &Options{Backoff: retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: time.Second, Jitter: retry.NoJitter}})
	require.Equal(t, 10*time.Millisecond, q.delay(1))
	require.Equal(t, 20*time.Millisecond, q.delay(2))
	require.Equal(t, time.Second, q.delay(20))
}

// TestPlacesOfAKeyAreARangeInNumberOrder: a key's places sort as its
// numbers do, and no other key's place, whatever its type or bytes (a
// string that starts like another key's place, a number, a document),
// falls between two of them: the worker's run read is one range.
func TestPlacesOfAKeyAreARangeInNumberOrder(t *testing.T) {
	t.Parallel()
	keys := make([]bson.RawValue, 0, 10)
	for _, k := range []any{"a", "a:0", "ab", "", int32(1), int64(1), 1.5, bson.D{{Key: "a", Value: 1}}, bson.NewObjectID()} {
		typ, data, err := bson.MarshalValue(k)
		require.NoError(t, err)
		keys = append(keys, bson.RawValue{Type: typ, Value: data})
	}
	// The string key whose bytes are those of key "a"'s place prefix.
	keys = append(keys, bson.RawValue{Type: bson.TypeString, Value: []byte(placeOf(keys[0], 7))})
	seqs := []int64{1, 2, 9, 10, 15, 16, 255, 256, 1 << 40, 1<<62 + 3}
	for i, k := range keys {
		for j := 1; j < len(seqs); j++ {
			lo, hi := placeOf(k, seqs[j-1]), placeOf(k, seqs[j])
			require.Less(t, lo, hi, "key %d: %d before %d", i, seqs[j-1], seqs[j])
			for o, other := range keys {
				if o == i {
					continue
				}
				for _, s := range seqs {
					p := placeOf(other, s)
					require.False(t, lo < p && p < hi, "key %d's place %d falls among key %d's", o, s, i)
				}
			}
		}
	}
}

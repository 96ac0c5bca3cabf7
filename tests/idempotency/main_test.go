package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

type bundle struct {
	db    *mongotest.DB
	coll  *mongo.Collection
	clock *store.ServerClock
}

func setup(t testing.TB) *bundle {
	t.Helper()
	db := mongotest.New(t)
	return &bundle{db: db, coll: db.Collection("keys"), clock: store.NewServerClock(store.HelloSampler(db.Client()), nil)}
}

// keys returns Keys on coll (b.coll if nil) for owner, with opts' other
// fields.
func (b *bundle) keys(t testing.TB, coll *mongo.Collection, owner string, opts *idempotency.Options) *idempotency.Keys {
	t.Helper()
	o := idempotency.Options{}
	if opts != nil {
		o = *opts
	}
	if coll == nil {
		coll = b.coll
	}
	o.Owner = owner
	if o.Clock == nil && coll == b.coll {
		o.Clock = b.clock
	}
	k, err := idempotency.New(coll, &o)
	require.NoError(t, err)
	return k
}

// counting returns a Func that counts its runs and returns res.
func counting(runs *atomic.Int32, res idempotency.Result) idempotency.Func {
	return func(context.Context, *idempotency.Call) (idempotency.Result, error) {
		runs.Add(1)
		return res, nil
	}
}

// stored is the key record as the tests look at it.
type stored struct {
	ID       string        `bson:"_id"`
	RID      bson.ObjectID `bson:"rid"`
	Epoch    int64         `bson:"epoch"`
	Attempts int           `bson:"attempts"`
	Points   []struct {
		K string        `bson:"k"`
		N string        `bson:"n"`
		D []byte        `bson:"d"`
		E int64         `bson:"e"`
		W bson.ObjectID `bson:"w"`
	} `bson:"points"`
	Result *struct {
		Status int    `bson:"status"`
		Body   []byte `bson:"body"`
		Epoch  int64  `bson:"epoch"`
	} `bson:"result"`
	ExpireAt time.Time `bson:"expireAt"`
	Lease    struct {
		Owner string `bson:"owner"`
		Epoch int64  `bson:"epoch"`
	} `bson:"_lease"`
}

func load(t testing.TB, coll *mongo.Collection, id string) stored {
	t.Helper()
	var s stored
	require.NoError(t, coll.FindOne(context.Background(), bson.D{{Key: "_id", Value: id}}).Decode(&s))
	return s
}

func count(t testing.TB, coll *mongo.Collection) int64 {
	t.Helper()
	n, err := coll.CountDocuments(context.Background(), bson.D{})
	require.NoError(t, err)
	return n
}

// commandText is a command's body and document sequences as extended JSON,
// for fault predicates.
func commandText(c *mongotest.Command) string {
	var sb strings.Builder
	sb.WriteString(c.Body.String())
	for _, docs := range c.Sequences {
		for _, d := range docs {
			sb.WriteString(d.String())
		}
	}
	return sb.String()
}

// writeOf matches the write to coll of the given kind, as the package and
// lease send them.
func writeOf(coll, kind string) mongotest.Match {
	return func(c *mongotest.Command) bool {
		if c.Collection != coll {
			return false
		}
		s := commandText(c)
		switch kind {
		case "open":
			return c.Name == "insert" && strings.Contains(s, `"fp"`)
		case "claim":
			return c.Name == "findAndModify" && strings.Contains(s, "_lease.acquiredAt")
		case "begin":
			return c.Name == "findAndModify" && strings.Contains(s, `"attempts"`)
		case "complete":
			return c.Name == "update" && strings.Contains(s, `"result"`) && strings.Contains(s, "$set")
		case "checkpoint":
			return c.Name == "update" && strings.Contains(s, "$push")
		case "release":
			return c.Name == "update" && strings.Contains(s, "$unset") && strings.Contains(s, "_lease.owner")
		}
		panic("unknown write kind " + kind)
	}
}

// eachMode runs fn with Keys in lease.ModeServer and lease.ModeEstimated.
// ModeServer runs on a server with $expr and $$NOW in writes: the shared
// one, or the second server mongotest knows of where the shared one (the
// embedded FerretDB v1) has none; it is skipped, saying how to run it, only
// where neither has them (see mongotest.Use).
func eachMode(t *testing.T, fn func(t *testing.T, mode lease.Mode)) {
	t.Helper()
	for _, mode := range []lease.Mode{lease.ModeServer, lease.ModeEstimated} {
		t.Run(mode.String(), func(t *testing.T) {
			if mode == lease.ModeServer {
				mongotest.Use(t, mongotest.Expr, mongotest.UpdatePipelines)
			}
			fn(t, mode)
		})
	}
}

// doUntilDone calls Do until it returns something other than
// ErrInProgress, sleeping the time left it reports in between.
func doUntilDone(ctx context.Context, t testing.TB, k *idempotency.Keys, key string, fp []byte, fn idempotency.Func) (idempotency.Result, error) {
	t.Helper()
	for {
		res, err := k.Do(ctx, key, fp, fn)
		var ip *idempotency.InProgressError
		if !errors.As(err, &ip) {
			return res, err
		}
		select {
		case <-ctx.Done():
			return res, err
		case <-time.After(min(ip.TimeLeft, 200*time.Millisecond)):
		}
	}
}

func retryWithNegativeInterval() retry.Policy { return retry.Policy{InitialInterval: -1} }

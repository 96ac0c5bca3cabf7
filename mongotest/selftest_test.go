package mongotest_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

func TestMain(m *testing.M) {
	if leakChild(m) {
		return
	}
	mongotest.Main(m, mongotest.CheckLeaks())
}

// TestSelfTestVersionCAS proves the backend keeps single-document atomicity
// for a conditional update: 16 goroutines × 200 version-checked increments
// end exactly at 3,200, the number of acknowledged increments. Embedded
// FerretDB without the serializing proxy lost most of them when this was
// measured at the project's start (about 3,000 of 3,200).
func TestSelfTestVersionCAS(t *testing.T) {
	const workers, perWorker = 16, 200
	db := mongotest.New(t)
	ctx := context.Background()
	coll := db.Collection("counter")
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "c"}, {Key: "n", Value: int64(0)}, {Key: "v", Value: int64(0)}})
	require.NoError(t, err)

	var acked, conflicts atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			streak := 0
			for done := 0; done < perWorker; {
				var doc struct {
					V int64 `bson:"v"`
				}
				if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "c"}}).Decode(&doc); err != nil {
					errs <- err
					return
				}
				res, err := coll.UpdateOne(ctx,
					bson.D{{Key: "_id", Value: "c"}, {Key: "v", Value: doc.V}},
					bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}, {Key: "v", Value: 1}}}})
				if err != nil {
					errs <- err
					return
				}
				if res.ModifiedCount == 1 {
					acked.Add(1)
					done++
					streak = 0
					continue
				}
				// Lost the race: back off with full jitter, exponentially in
				// the losing streak, as the retry package does.
				conflicts.Add(1)
				streak++
				backoffCap := min(time.Millisecond<<min(streak, 6), 50*time.Millisecond)
				time.Sleep(rand.N(backoffCap))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var final struct {
		N int64 `bson:"n"`
		V int64 `bson:"v"`
	}
	require.NoError(t, coll.FindOne(ctx, bson.D{{Key: "_id", Value: "c"}}).Decode(&final))
	t.Logf("self-test CAS: backend=%s %s (%s) acknowledged=%d final=%d version=%d conflicts=%d in %v",
		db.Server.Backend, db.Caps().Server, via(db.Server), acked.Load(), final.N, final.V, conflicts.Load(), time.Since(start).Round(time.Millisecond))
	require.Equal(t, int64(workers*perWorker), acked.Load())
	require.Equal(t, acked.Load(), final.N, "lost updates")
	require.Equal(t, acked.Load(), final.V)
}

// via says how the tests reach the server, for the self-test's log line.
func via(s *mongotest.Server) string {
	if s.Serialized {
		return "serializing proxy, FerretDB " + s.Embedded
	}
	return "direct, no proxy"
}

// TestSelfTestLeaseRace proves a findOneAndUpdate claim has exactly one
// winner: 32 goroutines race for a free lease in each of 200 rounds.
func TestSelfTestLeaseRace(t *testing.T) {
	const racers, rounds = 32, 200
	db := mongotest.New(t)
	ctx := context.Background()
	coll := db.Collection("locks")
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "l"}, {Key: "owner", Value: nil}})
	require.NoError(t, err)

	start := time.Now()
	double := 0
	for round := range rounds {
		var winners atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, racers)
		gate := make(chan struct{})
		for r := range racers {
			wg.Go(func() {
				<-gate
				err := coll.FindOneAndUpdate(ctx,
					bson.D{{Key: "_id", Value: "l"}, {Key: "owner", Value: nil}},
					bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: r}}}, {Key: "$inc", Value: bson.D{{Key: "epoch", Value: 1}}}},
					options.FindOneAndUpdate().SetReturnDocument(options.After)).Err()
				switch {
				case err == nil:
					winners.Add(1)
				case !errors.Is(err, mongo.ErrNoDocuments):
					errs <- err
				}
			})
		}
		close(gate)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		if winners.Load() != 1 {
			double++
			t.Errorf("round %d: %d winners, want exactly 1", round, winners.Load())
		}
		_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "l"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: nil}}}})
		require.NoError(t, err)
	}
	var doc struct {
		Epoch int64 `bson:"epoch"`
	}
	require.NoError(t, coll.FindOne(ctx, bson.D{{Key: "_id", Value: "l"}}).Decode(&doc))
	t.Logf("self-test lease race: backend=%s %s (%s) rounds=%d racers=%d rounds-with-double-grant=%d epoch=%d in %v",
		db.Server.Backend, db.Caps().Server, via(db.Server), rounds, racers, double, doc.Epoch, time.Since(start).Round(time.Millisecond))
	require.Equal(t, int64(rounds), doc.Epoch, "one grant per round")
}

// TestFaultDropNextReply: the write is in the database although the client
// got a network error.
func TestFaultDropNextReply(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	fault := f.DropNextReply(mongotest.Writes("acct"))
	_, err := f.Collection("acct").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "balance", Value: 10}})
	require.Error(t, err)
	require.True(t, store.IsNetwork(err), "want a network error, got %v", err)
	require.True(t, store.IsAmbiguous(err))
	require.True(t, fault.HasFired())
	require.Len(t, fault.Dropped(), 1)
	require.Equal(t, "insert", fault.Dropped()[0].Name)

	var doc bson.M
	require.NoError(t, db.Collection("acct").FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&doc),
		"the write whose reply was dropped must be in the database")

	// The fault is one-shot: the next write succeeds through the same client.
	_, err = f.Collection("acct").UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 5}}}})
	require.NoError(t, err)
	var got struct {
		Balance int `bson:"balance"`
	}
	require.NoError(t, db.Collection("acct").FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&got))
	require.Equal(t, 15, got.Balance)
}

// TestFaultDropMatchesOnlyItsCommand: reads and other collections pass.
func TestFaultDropMatchesOnlyItsCommand(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	fault := f.DropNextReply(mongotest.Writes("target"))
	_, err := f.Collection("other").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)
	require.ErrorIs(t, f.Collection("target").FindOne(ctx, bson.D{}).Err(), mongo.ErrNoDocuments, "a read must pass the write fault")
	require.False(t, fault.HasFired())
	_, err = f.Collection("target").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.True(t, store.IsNetwork(err), "got %v", err)
	require.True(t, fault.HasFired())
}

func TestFaultDelayReplies(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	coll := f.Collection("d")
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)

	const delay = 300 * time.Millisecond
	stop := f.DelayReplies(delay, mongotest.Commands([]string{"find"}))
	began := time.Now()
	require.NoError(t, coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Err())
	require.GreaterOrEqual(t, time.Since(began), delay, "the reply was not delayed")

	// A deadline shorter than the delay fails with a timeout.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = coll.FindOne(short, bson.D{{Key: "_id", Value: 1}}).Err()
	cancel()
	require.True(t, store.IsTimeout(err), "got %v", err)

	stop()
	before := f.Requests()
	require.NoError(t, coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Err())
	require.Greater(t, f.Requests(), before, "the find passed through this client's proxy")
}

// TestFaultDelayRepliesStopReleasesHeld: stop and Close end the delay of a
// reply already being held, not only of later ones. The delay is an hour and
// the find's context a minute: the find succeeds only if stop released its
// reply.
func TestFaultDelayRepliesStopReleasesHeld(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	coll := f.Collection("d")
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)

	// held is closed when the proxy matches the find's reply against the
	// rule: it is then being held.
	find := func() (held chan struct{}, match mongotest.Match) {
		held = make(chan struct{})
		var once sync.Once
		return held, func(c *mongotest.Command) bool {
			if c.Name != "find" {
				return false
			}
			once.Do(func() { close(held) })
			return true
		}
	}
	held, match := find()
	stop := f.DelayReplies(time.Hour, match)
	errc := make(chan error, 1)
	go func() { errc <- coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Err() }()
	<-held
	stop()
	require.NoError(t, <-errc, "stop released the held reply before the find's context ended")

	// Close releases a held reply too (the client then sees its connection
	// closed), and does not wait for the delay to end.
	held, match = find()
	f.DelayReplies(time.Hour, match)
	go func() { errc <- coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Err() }()
	<-held
	closed := make(chan struct{})
	go func() { f.Close(); close(closed) }()
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Close waited for the held reply's delay")
	}
	require.Error(t, <-errc, "the client's connection was closed")
}

func TestFaultPause(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	coll := f.Collection("p")
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)

	const pause = 400 * time.Millisecond
	f.Pause(pause)
	began := time.Now()
	_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}})
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(began), pause-20*time.Millisecond, "traffic was not paused")

	// The paused client does not hold up other clients.
	f.Pause(pause)
	began = time.Now()
	require.NoError(t, db.Collection("p").FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Err())
	require.Less(t, time.Since(began), pause, "a pause on one fault proxy must not stall the shared client")
}

func TestFaultResetConnections(t *testing.T) {
	db := mongotest.New(t)
	f := db.Faulty(t, nil)
	ctx := context.Background()
	coll := f.Collection("r")
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)

	// Reset in the middle of a delayed request: that request fails with a
	// network error.
	stop := f.DelayReplies(time.Second, mongotest.Commands([]string{"find"}))
	errc := make(chan error, 1)
	go func() { errc <- coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Err() }()
	time.Sleep(200 * time.Millisecond)
	require.GreaterOrEqual(t, f.ResetConnections(), 1)
	err = <-errc
	require.True(t, store.IsNetwork(err), "got %v", err)
	stop()

	// The client reconnects on its own afterwards.
	require.NoError(t, coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Err())
}

func TestCapabilitiesReported(t *testing.T) {
	db := mongotest.New(t)
	caps := db.Caps()
	t.Logf("backend=%s capabilities: %s", db.Server.Backend, caps)
	require.NotEmpty(t, caps.Version)
	require.NotEmpty(t, caps.Topology)
	require.Equal(t, db.Server.Backend == mongotest.BackendEmbedded, db.Server.Serialized,
		"only the embedded backend is behind the serializing proxy")
	if db.Server.Backend == mongotest.BackendEmbedded {
		require.Equal(t, store.FerretDBv1, caps.Server)
		require.Equal(t, store.Standalone, caps.Topology)
		require.False(t, caps.Transactions)
		require.False(t, caps.TTLIndexes)
	}
	// Every capability Require knows maps to the probe's answer.
	for c, want := range map[mongotest.Capability]bool{
		mongotest.Transactions:    caps.Transactions,
		mongotest.RetryableWrites: caps.RetryableWrites,
		mongotest.Expr:            caps.Expr,
		mongotest.UpdatePipelines: caps.UpdatePipelines,
		mongotest.TTLIndexes:      caps.TTLIndexes,
	} {
		require.Equal(t, want, db.Server.Has(c), "%s", c)
	}
}

func TestDatabasesAreFreshAndDropped(t *testing.T) {
	ctx := context.Background()
	var name string
	t.Run("inner", func(t *testing.T) {
		db := mongotest.New(t)
		name = db.Name()
		n, err := db.Collection("x").CountDocuments(ctx, bson.D{})
		require.NoError(t, err)
		require.Zero(t, n)
		_, err = db.Collection("x").InsertOne(ctx, bson.D{{Key: "a", Value: 1}})
		require.NoError(t, err)
	})
	s, err := mongotest.Start(ctx)
	require.NoError(t, err)
	names, err := s.Client.ListDatabaseNames(ctx, bson.D{{Key: "name", Value: name}})
	require.NoError(t, err)
	require.Empty(t, names, "database %s was not dropped at cleanup", name)
}

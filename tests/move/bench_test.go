package move_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// benchAccounts is how many accounts BenchmarkMoves moves value among, and
// benchCallers how many goroutines call Move.
const (
	benchAccounts = 100
	benchCallers  = 16
)

// BenchmarkMoves moves b.N random amounts among 100 accounts from 16
// goroutines, relayed by two queues of 10 workers each, and reports:
//
//   - moves/s: moves settled per second, from the first debit to the last
//     clean-up;
//
//   - debit-round-trips: the caller's round trips per move (its client
//     carries nothing else);
//
//   - relay-commands/move: the commands everything else sends per move
//     (the enqueue, the queue's claims and records, the relay's reads and
//     writes), counted by a command monitor on their client;
//
//   - floor-moves/s: in the same run, the raw driver doing the least any
//     move must do (floorMoves), and x-floor, moves/s over floor-moves/s.
//
//     go test -run '^$' -bench 'Moves$' -benchtime 2000x ./tests/move
func BenchmarkMoves(b *testing.B) { benchMoves(b, false) }

// BenchmarkMovesDrain is BenchmarkMoves with the relay started only once
// every debit is made: moves/s is then how fast the relay alone settles a
// backlog of b.N moves (from its start to the last clean-up), and debits/s
// how fast the callers alone debit.
func BenchmarkMovesDrain(b *testing.B) { benchMoves(b, true) }

// benchMoves is BenchmarkMoves, with the relay started after the debits
// when drain is set.
func benchMoves(b *testing.B, drain bool) {
	b.Helper()
	bb := setup(b)
	names := make([]string, benchAccounts)
	for i := range names {
		names[i] = fmt.Sprintf("acct-%03d", i)
		bb.insert(b, names[i], 1_000_000)
	}
	var relayCommands atomic.Int64
	opts := store.ClientOptions(bb.db.Server.URI, nil).SetMonitor(&event.CommandMonitor{
		Started: func(context.Context, *event.CommandStartedEvent) { relayCommands.Add(1) },
	})
	client, err := mongo.Connect(opts)
	require.NoError(b, err)
	b.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	relayDB := client.Database(bb.db.Name())
	newQueue := func() *deferred.Queue {
		q, err := deferred.New(relayDB.Collection("jobs"), &deferred.Options{
			Workers: 10, PollInterval: 50 * time.Millisecond, HoleTimeout: 500 * time.Millisecond,
			Backoff: retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		})
		require.NoError(b, err)
		return q
	}
	moverOpts := &move.Options{Field: "balance", Grace: time.Nanosecond, Outcomes: relayDB.Collection("accounts_moves")}
	stops := make([]func(), 0, 2)
	relays := make([]*deferred.Queue, 0, 2)
	for range 2 {
		q := newQueue()
		bb.mover(b, q, relayDB, moverOpts)
		relays = append(relays, q)
		if !drain {
			stops = append(stops, run(b, q))
		}
	}
	f := bb.db.Faulty(b, nil)
	o := *moverOpts
	o.Outcomes = f.Collection("accounts_moves")
	caller := bb.mover(b, newQueue(), f.Database, &o) // its queue only enqueues, on relayDB

	b.ResetTimer()
	start := time.Now()
	before, commandsBefore := f.Requests(), relayCommands.Load()
	concurrently(b.N, func(rng *rand.Rand, from, to string) {
		if _, err := caller.Move(context.Background(), from, to, int64(1+rng.IntN(100)), nil); err != nil {
			b.Errorf("Move: %v", err)
		}
	}, names)
	debits := f.Requests() - before
	debitTime := time.Since(start)
	if drain {
		start = time.Now()
		for _, q := range relays {
			stops = append(stops, run(b, q))
		}
	}
	for {
		n, err := bb.db.Collection("accounts").CountDocuments(bb.ctx, bson.D{{Key: "_mv.n", Value: bson.D{{Key: "$gt", Value: 0}}}})
		require.NoError(b, err)
		if n == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(start)
	commands := relayCommands.Load() - commandsBefore
	for _, stop := range stops {
		stop() // the floor runs on a server the relay no longer polls
	}
	floor := floorMoves(b, bb, b.N, names)
	b.StopTimer()
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, "moves/s")
	b.ReportMetric(float64(b.N)/debitTime.Seconds(), "debits/s")
	b.ReportMetric(float64(debits)/float64(b.N), "debit-round-trips")
	b.ReportMetric(float64(commands)/float64(b.N), "relay-commands/move")
	b.ReportMetric(floor, "floor-moves/s")
	b.ReportMetric(rate/floor, "x-floor")
	s, err := bb.observer(b).Sum(bb.ctx, anys(names)...)
	require.NoError(b, err)
	require.Equal(b, int64(benchAccounts*1_000_000), s.Sum)
}

// floorMoves has the raw driver make n moves among accounts named as
// names, in a collection of their own, from the same 16 goroutines, doing
// the least any move must do: three findOneAndUpdates in sequence, the
// debit (guarded, recording the pending entry), the credit (conditioned on
// the move's marker absent, setting it) and the entry's removal. Nothing
// makes them survive a crash or a lost reply: no queue, no outcome record,
// no clean-up, no settling. It returns the moves per second, a ceiling no
// relay that settles every move exactly once can pass on that server.
func floorMoves(b *testing.B, bb *bundle, n int, names []string) float64 {
	b.Helper()
	coll := bb.db.Collection("floor")
	docs := make([]any, len(names))
	for i, name := range names {
		docs[i] = bson.D{{Key: "_id", Value: name}, {Key: "balance", Value: int64(1_000_000)}, {Key: "version", Value: int64(1)}}
	}
	_, err := coll.InsertMany(bb.ctx, docs)
	require.NoError(b, err)
	after := options.FindOneAndUpdate().SetReturnDocument(options.After)
	step := func(filter, update bson.D) {
		if err := coll.FindOneAndUpdate(bb.ctx, filter, update, after).Err(); err != nil {
			b.Errorf("floor: %v", err)
		}
	}
	start := time.Now()
	concurrently(n, func(rng *rand.Rand, from, to string) {
		v := int64(1 + rng.IntN(100))
		m := bson.NewObjectID().Hex()
		step(bson.D{{Key: "_id", Value: from}, {Key: "balance", Value: bson.D{{Key: "$gte", Value: v}}}}, bson.D{
			{Key: "$inc", Value: bson.D{{Key: "balance", Value: -v}, {Key: "_mv.n", Value: int64(1)}, {Key: "version", Value: int64(1)}}},
			{Key: "$set", Value: bson.D{{Key: "_mv.o." + m, Value: bson.D{{Key: "to", Value: to}, {Key: "v", Value: v}}}}},
		})
		step(bson.D{{Key: "_id", Value: to}, {Key: "_mv.i." + m, Value: bson.D{{Key: "$exists", Value: false}}}}, bson.D{
			{Key: "$inc", Value: bson.D{{Key: "balance", Value: v}, {Key: "version", Value: int64(1)}}},
			{Key: "$set", Value: bson.D{{Key: "_mv.i." + m, Value: bson.D{{Key: "v", Value: v}}}}},
		})
		step(bson.D{{Key: "_id", Value: from}, {Key: "_mv.o." + m, Value: bson.D{{Key: "$exists", Value: true}}}}, bson.D{
			{Key: "$unset", Value: bson.D{{Key: "_mv.o." + m, Value: ""}}},
			{Key: "$inc", Value: bson.D{{Key: "_mv.n", Value: int64(-1)}, {Key: "version", Value: int64(1)}}},
		})
	}, names)
	return float64(n) / time.Since(start).Seconds()
}

// concurrently calls move n times from 16 goroutines, each with its own
// random source, for two distinct random accounts of names.
func concurrently(n int, move func(rng *rand.Rand, from, to string), names []string) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for g := range uint64(benchCallers) {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(g, 1))
			for next.Add(1) <= int64(n) {
				i, j := rng.IntN(len(names)), rng.IntN(len(names)-1)
				if j >= i {
					j++
				}
				move(rng, names[i], names[j])
			}
		})
	}
	wg.Wait()
}

func anys(names []string) []any {
	out := make([]any, len(names))
	for i, n := range names {
		out[i] = n
	}
	return out
}

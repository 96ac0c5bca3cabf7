package docs_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

// counter counts the commands a client sends to one database, hello and
// the driver's own monitoring left out.
type counter struct {
	mu    sync.Mutex
	db    string
	names []string
}

func (c *counter) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.names
	c.names = nil
	return out
}

// monitored returns db's database on a client of its own whose commands c
// counts.
func monitored(t *testing.T, db *mongotest.DB, c *counter) *mongo.Database {
	t.Helper()
	c.db = db.Name()
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.DatabaseName != c.db {
			return
		}
		c.mu.Lock()
		c.names = append(c.names, e.CommandName)
		c.mu.Unlock()
	}}
	client, err := mongo.Connect(options.Client().ApplyURI(db.Server.URI).SetMonitor(mon))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	return client.Database(db.Name())
}

// size is the BSON size of the stored document with id.
func size(t *testing.T, coll *mongo.Collection, id any) int {
	t.Helper()
	raw, err := coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: id}}).Raw()
	require.NoError(t, err)
	return len(raw)
}

type account struct {
	ID      string `bson:"_id"`
	Owner   string `bson:"owner"`
	Balance int64  `bson:"balance"`
	Version int64  `bson:"version"`
}

type plainAccount struct {
	ID      string `bson:"_id"`
	Owner   string `bson:"owner"`
	Balance int64  `bson:"balance"`
}

// TestFootprint measures what a document carries: the same account stored
// plain by the driver, after versioned's Insert, after 40 Modify calls,
// with a document lease held and released, and after a deferred job
// applied to it. docs/costs.md quotes what it prints:
//
//	go test -count=1 -run Footprint -v ./tests/docs
func TestFootprint(t *testing.T) {
	db := mongotest.New(t)
	ctx := t.Context()
	coll := db.Collection("accounts")
	_, err := coll.InsertOne(ctx, plainAccount{ID: "plain", Owner: "Ana", Balance: 100})
	require.NoError(t, err)
	repo, err := versioned.New[account](coll, nil)
	require.NoError(t, err)
	require.NoError(t, repo.Insert(ctx, &account{ID: "ana", Owner: "Ana", Balance: 100}))
	plain, inserted := size(t, coll, "plain"), size(t, coll, "ana")
	show := func(what string) {
		raw, err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "ana"}}).Raw()
		require.NoError(t, err)
		t.Logf("%s: %s", what, raw.String())
	}
	show("after Insert")
	after := map[int]int{}
	for i := 1; i <= 40; i++ {
		_, err := repo.Modify(ctx, "ana", func(a *account) error { a.Balance++; return nil })
		require.NoError(t, err)
		after[i] = size(t, coll, "ana")
	}
	show("after 40 Modify calls")
	t.Logf("backend %s", db.Server.Backend)
	t.Logf("plain document (driver InsertOne):  %d bytes", plain)
	t.Logf("after versioned Insert:             %d bytes (+%d)", inserted, inserted-plain)
	for _, n := range []int{1, 2, 10, versioned.WriteIDs, versioned.WriteIDs + 1, 40} {
		t.Logf("after %2d Modify calls:             %d bytes (+%d)", n, after[n], after[n]-plain)
	}
	require.Equal(t, after[versioned.WriteIDs], after[40], "the list keeps the last WriteIDs write ids, no more")
	require.LessOrEqual(t, after[40]-plain, 256, "the version and the write-id metadata outgrew 256 bytes")

	// The default owner, "host/pid/random", varies in length with the
	// host's name: a fixed one of the same form keeps the figures the same
	// on every machine.
	leases, err := lease.New(coll, &lease.Options{TTL: 30 * time.Second, Owner: docOwner})
	require.NoError(t, err)
	l, err := leases.TryAcquire(ctx, "plain")
	require.NoError(t, err)
	held := size(t, coll, "plain")
	require.NoError(t, l.Release(ctx))
	released := size(t, coll, "plain")
	t.Logf("plain document, lease held:         %d bytes (+%d)", held, held-plain)
	t.Logf("plain document, lease released:     %d bytes (+%d)", released, released-plain)

	q, err := deferred.New(db.Collection("jobs"), &deferred.Options{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	change, err := deferred.NewChange(q, "add", repo, func(a *account, n int64) error { a.Balance += n; return nil })
	require.NoError(t, err)
	before := size(t, coll, "ana")
	id, err := change.Enqueue(ctx, "ana", 1)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = q.Run(runCtx) })
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	job, err := q.Wait(waitCtx, id, 20*time.Millisecond)
	stop()
	wg.Wait()
	require.NoError(t, err)
	require.Equal(t, deferred.StateCompleted, job.State)
	stamped := size(t, coll, "ana")
	t.Logf("after one deferred job:             %d bytes (+%d over the Modify-ed document)", stamped, stamped-before)
	jobSize, err := db.Collection("jobs").FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Raw()
	require.NoError(t, err)
	t.Logf("the completed job document:         %d bytes", len(jobSize))

	// What README.md and docs/costs.md say.
	where := documentedServer(db)
	if where == "" {
		t.Logf("the docs quote no figures for %s: not compared", db.Caps().Server)
		return
	}
	requireQuoted(t, "README.md",
		fmt.Sprintf("bytes added to a %d-byte document", plain),
		fmt.Sprintf("Insert: +%d", inserted-plain),
		fmt.Sprintf("+%d per write id, %d kept: %d bytes in all", after[1]-inserted, versioned.WriteIDs, after[versioned.WriteIDs]-plain),
		fmt.Sprintf("+%d (the stamp)", stamped-before))
	requireQuoted(t, "docs/costs.md",
		fmt.Sprintf("A %d-byte document", plain),
		fmt.Sprintf("| plain, inserted by the driver | %d |", plain),
		fmt.Sprintf("| after `Repo.Insert` | %d | +%d:", inserted, inserted-plain),
		fmt.Sprintf("| after 1, 2, 10 `Modify` calls | %d, %d, %d | +%d per write id", after[1], after[2], after[10], after[1]-inserted),
		fmt.Sprintf("| after %d, %d, 40 `Modify` calls | %d | +%d, and no more: the list keeps the last %d write ids",
			versioned.WriteIDs, versioned.WriteIDs+1, after[40], after[40]-plain, versioned.WriteIDs),
		fmt.Sprintf("+%d: the queue's stamp", stamped-before),
		fmt.Sprintf("an owner string of %d bytes", len(docOwner)))
	switch where {
	case onEmbedded:
		requireQuoted(t, "README.md", fmt.Sprintf("+%d while held, +%d after", held-plain, released-plain))
		requireQuoted(t, "docs/costs.md",
			fmt.Sprintf("| with a document lease held | %d (embedded), ", held), fmt.Sprintf("| +%d / ", held-plain),
			fmt.Sprintf("| after the lease's release | %d / ", released), fmt.Sprintf("| +%d / ", released-plain))
	case onDocumentDB:
		requireQuoted(t, "README.md", fmt.Sprintf("(DocumentDB: +%d, +%d)", held-plain, released-plain))
		requireQuoted(t, "docs/costs.md",
			fmt.Sprintf(", %d (DocumentDB) |", held), fmt.Sprintf(" / +%d: the `_lease` record", held-plain),
			fmt.Sprintf(" / %d | +", released), fmt.Sprintf(" / +%d: the record keeps", released-plain))
	}
}

// docOwner is the lease owner TestFootprint writes: the form of the default
// ("host/pid/random"), of a typical length.
const docOwner = "web-1/48213/9f2c4e7a1b3d"

// TestRoundTripCosts counts, with a command monitor, the commands each
// operation sends on an uncontended document. docs/costs.md quotes what it
// prints:
//
//	go test -count=1 -run RoundTripCosts -v ./tests/docs
func TestRoundTripCosts(t *testing.T) {
	db := mongotest.New(t)
	ctx := t.Context()
	c := &counter{}
	mdb := monitored(t, db, c)
	report := func(op string) []string {
		names := c.take()
		t.Logf("%-40s %d  %v", op, len(names), names)
		return names
	}
	t.Logf("backend %s", db.Server.Backend)
	repo, err := versioned.New[account](mdb.Collection("accounts"), nil)
	require.NoError(t, err)
	n := map[string]int{} // round trips by operation, for the docs' figures
	require.NoError(t, repo.Insert(ctx, &account{ID: "ana", Balance: 100}))
	n["insert"] = len(report("versioned Insert"))
	a, err := repo.Get(ctx, "ana")
	require.NoError(t, err)
	n["get"] = len(report("versioned Get"))
	a.Balance++
	require.NoError(t, repo.Update(ctx, a))
	n["update"] = len(report("versioned Update"))
	_, err = repo.Modify(ctx, "ana", func(a *account) error { a.Balance++; return nil })
	require.NoError(t, err)
	n["modify"] = len(report("versioned Modify"))
	_, err = repo.Guarded(ctx, "ana", bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: 1}}}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -1}}}})
	require.NoError(t, err)
	n["guarded"] = len(report("versioned Guarded"))
	fresh, err := versioned.New[account](mdb.Collection("accounts"), nil)
	require.NoError(t, err)
	_, err = fresh.Guarded(ctx, "ana", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
	require.NoError(t, err)
	n["guarded unseen"] = len(report("versioned Guarded, document not seen yet"))

	leases, err := lease.New(mdb.Collection("accounts"), &lease.Options{TTL: 30 * time.Second})
	require.NoError(t, err)
	_, err = leases.Mode(ctx) // the one-time probe, outside the counts
	require.NoError(t, err)
	c.take()
	l, err := leases.TryAcquire(ctx, "ana")
	require.NoError(t, err)
	n["tryacquire"] = len(report("lease TryAcquire"))
	require.NoError(t, l.Release(ctx))
	n["release"] = len(report("lease Release"))
	require.NoError(t, leases.Do(ctx, "ana", func(context.Context, *lease.Lease) error { return nil }))
	n["do"] = len(report("lease Do (fn sends nothing)"))

	keys, err := idempotency.New(mdb.Collection("keys"), &idempotency.Options{TTL: 30 * time.Second})
	require.NoError(t, err)
	fn := func(context.Context, *idempotency.Call) (idempotency.Result, error) {
		return idempotency.Result{Status: 201, Body: []byte("ok")}, nil
	}
	_, err = keys.Do(ctx, "k-warm", []byte("fp"), fn) // index and clock set-up, outside the counts
	require.NoError(t, err)
	c.take()
	_, err = keys.Do(ctx, "k1", []byte("fp"), fn)
	require.NoError(t, err)
	n["keys first"] = 3
	require.Equal(t, []string{"find", "insert", "update"}, report("idempotency Do, first request"),
		"the record's read, its insert with the claim, the result stored with the release")
	res, err := keys.Do(ctx, "k1", []byte("fp"), fn)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	n["keys replay"] = 1
	require.Equal(t, []string{"find"}, report("idempotency Do, replay"))

	q, err := deferred.New(mdb.Collection("jobs"), nil)
	require.NoError(t, err)
	change, err := deferred.NewChange(q, "add", repo, func(a *account, n int64) error { a.Balance += n; return nil })
	require.NoError(t, err)
	_, err = q.EnsureIndexes(ctx)
	require.NoError(t, err)
	c.take()
	_, err = change.Enqueue(ctx, "ana", 1)
	require.NoError(t, err)
	n["enqueue first"] = len(report("deferred Enqueue, key's first"))
	_, err = change.Enqueue(ctx, "ana", 1)
	require.NoError(t, err)
	n["enqueue"] = len(report("deferred Enqueue"))

	// Jobs run by a worker, counted on a client of its own: n jobs of one
	// key enqueued beforehand, then one Run until the last completes. The
	// difference between 11 jobs and 1 is the cost of 10 jobs, without the
	// worker's start-up (its sweep, its first poll, the key's claim). The
	// handler is a Change (the run applied in one Modify) or a Guarded
	// write per job.
	work := func(n int, guarded bool) int {
		wc := &counter{}
		wdb := monitored(t, db, wc)
		coll := fmt.Sprintf("jobs%d%v", n, guarded)
		wq, err := deferred.New(wdb.Collection(coll), &deferred.Options{PollInterval: time.Hour, Workers: 1})
		require.NoError(t, err)
		wrepo, err := versioned.New[account](wdb.Collection("accounts"), nil)
		require.NoError(t, err)
		_, err = deferred.NewChange(wq, "add", wrepo, func(a *account, n int64) error { a.Balance += n; return nil })
		require.NoError(t, err)
		_, err = deferred.Register(wq, "inc", func(ctx context.Context, job *deferred.Job, n int64) error {
			_, err := deferred.Guarded(ctx, job, wrepo, "ana", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: n}}}})
			return err
		})
		require.NoError(t, err)
		_, err = wq.EnsureIndexes(ctx)
		require.NoError(t, err)
		eq, err := deferred.New(mdb.Collection(coll), nil)
		require.NoError(t, err)
		echange, err := deferred.NewChange(eq, "add", repo, func(a *account, n int64) error { a.Balance += n; return nil })
		require.NoError(t, err)
		einc, err := deferred.Register(eq, "inc", func(context.Context, *deferred.Job, int64) error { return nil })
		require.NoError(t, err)
		var last bson.ObjectID
		for range n {
			if guarded {
				last, err = einc.Enqueue(ctx, "ana", 1)
			} else {
				last, err = echange.Enqueue(ctx, "ana", 1)
			}
			require.NoError(t, err)
		}
		c.take()
		wc.take()
		runCtx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { _ = wq.Run(runCtx) })
		waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		job, err := eq.Wait(waitCtx, last, 5*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, deferred.StateCompleted, job.State)
		time.Sleep(100 * time.Millisecond) // the key's release
		stop()
		wg.Wait()
		names := wc.take()
		what := map[bool]string{false: "Change", true: "Guarded"}[guarded]
		t.Logf("%-40s %d  %v", fmt.Sprintf("deferred: a worker, %d %s job(s) of one key", n, what), len(names), names)
		return len(names)
	}
	perJob := map[bool]float64{}
	for _, guarded := range []bool{false, true} {
		one, eleven := work(1, guarded), work(11, guarded)
		perJob[guarded] = float64(eleven-one) / 10
		if !guarded {
			n["claim one change"] = one
		}
		what := map[bool]string{false: "Change", true: "Guarded"}[guarded]
		t.Logf("%-40s %.1f", "deferred: per "+what+" job, (11 jobs - 1 job)/10", float64(eleven-one)/10)
		// docs/costs.md: a Change job in a run costs nothing of its own, a
		// Guarded job two (its write, and the command that records it and
		// claims the next); one more command in ten jobs is a poll, not a
		// cost.
		limit := map[bool]int{false: 1, true: 21}[guarded]
		require.LessOrEqual(t, eleven-one, limit, "deferred: 10 more %s jobs in a run", what)
	}
	fmt.Println()

	// What README.md and docs/costs.md say.
	where := documentedServer(db)
	if where == "" {
		t.Logf("the docs quote no figures for %s: not compared", db.Caps().Server)
		return
	}
	if n["insert"] != n["get"] || n["get"] != n["update"] {
		t.Errorf("Insert, Get and Update took %d, %d and %d round trips: the docs say one figure for all", n["insert"], n["get"], n["update"])
	}
	requireQuoted(t, "README.md",
		fmt.Sprintf("| `versioned` Insert, Get, Update, Delete | %d each |", n["insert"]),
		fmt.Sprintf("| `Guarded`; `Modify` | %d (%d the first time a `Repo` sees the document); %d per attempt", n["guarded"], n["guarded unseen"], n["modify"]),
		fmt.Sprintf("| `idempotency` first request; replay | %d around your function; %d |", n["keys first"], n["keys replay"]),
		fmt.Sprintf("| `deferred` Enqueue; a job | %d (a key's first: %d);", n["enqueue"], n["enqueue first"]),
		fmt.Sprintf("(a `Guarded` handler: +%.0f a job)", perJob[true]))
	requireQuoted(t, "docs/costs.md",
		fmt.Sprintf("| `Repo.Insert`, `Get`, `Update`, `Delete` | %d each |", n["insert"]),
		fmt.Sprintf("| `Repo.Guarded` | %d |", n["guarded"]),
		fmt.Sprintf("not seen yet: %d (find, findAndModify)", n["guarded unseen"]),
		fmt.Sprintf("| `Repo.Modify` | %d |", n["modify"]),
		fmt.Sprintf("| `Lease.Release` | %d |", n["release"]),
		fmt.Sprintf("| `Manager.Do` (fn sends nothing) | %d |", n["do"]),
		fmt.Sprintf("| `Keys.Do`, first request | %d |", n["keys first"]),
		fmt.Sprintf("| `Keys.Do`, replay | %d |", n["keys replay"]),
		fmt.Sprintf("| `Queue.Enqueue`, `Change.Enqueue` | %d |", n["enqueue"]),
		fmt.Sprintf("a key's first job: %d", n["enqueue first"]),
		fmt.Sprintf("| a job on its worker, `Guarded` handler | %.0f |", perJob[true]))
	if perJob[false] < 0.5 {
		requireQuoted(t, "README.md", "a run of a key's due jobs costs what one job does")
		requireQuoted(t, "docs/costs.md", "| a job on its worker, `NewChange` handler | 0 of its own |")
	} else {
		t.Errorf("a NewChange job costs %.1f round trips of its own in a run: the docs say 0", perJob[false])
	}
	switch where {
	case onEmbedded: // no $expr: TryAcquire's first claim of a Manager
		requireQuoted(t, "README.md", fmt.Sprintf("| `lease` `Do`; `TryAcquire`, `Release` | %d; %d each (a `Manager`'s first claim without `$expr`: %d)",
			n["do"], n["release"], n["tryacquire"]))
		requireQuoted(t, "docs/costs.md", fmt.Sprintf("a `Manager`'s first claim %d", n["tryacquire"]),
			fmt.Sprintf("| %d (embedded), ", n["claim one change"]))
	case onDocumentDB:
		requireQuoted(t, "README.md", fmt.Sprintf("| `lease` `Do`; `TryAcquire`, `Release` | %d; %d each", n["do"], n["tryacquire"]))
		requireQuoted(t, "docs/costs.md", fmt.Sprintf("| `Manager.TryAcquire` | %d |", n["tryacquire"]),
			fmt.Sprintf(", %d (DocumentDB) |", n["claim one change"]))
	}
}

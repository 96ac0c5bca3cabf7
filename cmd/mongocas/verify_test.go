package main_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

type check struct {
	Name, Kind, Result, Detail string
	History                    []string
}

type verifyReport struct {
	Operations  int64
	LostReplies struct{ Seen, Settled, Landed, Resent, NotLanded, Unknown int64 }
	Clock       struct{ Readings int }
	Checks      []check
	Held        []string
	Broken      []string
	NotTested   []string
}

// result returns the check whose name starts with prefix.
func (r verifyReport) result(t *testing.T, prefix string) check {
	t.Helper()
	for _, c := range r.Checks {
		if strings.HasPrefix(c.Name, prefix) {
			return c
		}
	}
	t.Fatalf("no check %q in the report", prefix)
	return check{}
}

// TestVerifyHolds: on the test server every guarantee holds, the server
// lines agree with store.Probe, the clock figures are shown, and the scratch
// collections are dropped.
func TestVerifyHolds(t *testing.T) {
	db := mongotest.New(t)
	caps, err := store.Probe(context.Background(), db.Database)
	if err != nil {
		t.Fatal(err)
	}
	// 8 s: at 4 s, on DocumentDB under the CI's stress sizes, the named
	// lease's holder was once never taken over ("not tested", exit 3).
	r := run(t, "", args(db, "verify", "--duration", "8s", "--clients", "3")...)
	t.Logf("verify on the %s backend:\n%s%s", db.Server.Backend, r.stderr, r.stdout)
	wantCode(t, r, 0)
	for _, want := range []string{"versioned: linearizable writes", "lease: one holder at a time (document lease)",
		"lease: one holder at a time (named lease)", "lease: a taken-over holder's fenced write", "idempotency: a new key's racing first",
		"reads: a read sees every write", "clock: the clients agree", "server: racing upserts", "server: $slice", "server: $$NOW in writes",
		"\nclock: offset ", "lost replies seen", "summary: 7 held, 0 broken, 0 not tested", "dropped its"} {
		if !strings.Contains(r.stdout+r.stderr, want) {
			t.Errorf("no %q in the output", want)
		}
	}
	if !strings.Contains(r.stderr, "verify: 1s of 8s, ") {
		t.Errorf("no progress line")
	}
	// Long enough that a holder dies and is taken over on a loaded machine
	// (at 3 s, with a second copy of the suite beside it, once none did:
	// "not testable").
	rj := run(t, "", args(db, "verify", "--duration", "8s", "--json")...)
	wantCode(t, rj, 0)
	var rep verifyReport
	decode(t, rj, &rep)
	for _, c := range rep.Checks {
		if c.Kind == "guarantee" && c.Result != "held" {
			t.Errorf("%s: %s (%s)", c.Name, c.Result, c.Detail)
		}
		if c.Name == "server: $$NOW in writes" && (c.Result == "held") != (caps.Expr && caps.UpdatePipelines) {
			t.Errorf("%s: %s, but store.Probe says $expr %v, update pipelines %v", c.Name, c.Result, caps.Expr, caps.UpdatePipelines)
		}
	}
	if rep.Operations < 100 || rep.Clock.Readings < 8 || len(rep.Held) != 7 {
		t.Errorf("%d operations, %d clock readings, %d guarantees held", rep.Operations, rep.Clock.Readings, len(rep.Held))
	}
	names, err := db.ListCollectionNames(context.Background(), bson.D{})
	if err != nil || len(names) > 0 {
		t.Errorf("collections left, the probe's or verify's: %v %v", names, err)
	}
}

// TestVerifyUntestedIsNotAPass: a run too short to test a guarantee exits
// 3, not 0, and its summary names what was not tested.
func TestVerifyUntestedIsNotAPass(t *testing.T) {
	db := mongotest.New(t)
	r := run(t, "", args(db, "verify", "--duration", "300ms", "--clients", "2")...)
	t.Logf("verify --duration 300ms:\n%s%s", r.stderr, r.stdout)
	wantCode(t, r, 3)
	if !strings.Contains(r.stdout, "  not tested: ") || !strings.Contains(r.stdout, "raise --duration (exit status 3)") {
		t.Errorf("the summary does not name what was not tested")
	}
}

// TestVerifyHygiene: --help exits 0 for every subcommand; a database with
// other collections needs --yes; leftovers of an interrupted run are named,
// then dropped with --drop-leftovers.
func TestVerifyHygiene(t *testing.T) {
	for _, cmd := range []string{"doctor", "jobs", "leases", "keys", "moves", "verify"} {
		r := run(t, "", cmd, "--help")
		wantCode(t, r, 0)
		if !strings.Contains(r.stdout, "mongocas "+cmd) || !strings.Contains(r.stdout, "-timeout") {
			t.Errorf("%s --help printed:\n%s", cmd, r.stdout)
		}
	}
	db := mongotest.New(t)
	ctx := context.Background()
	if _, err := db.Collection("orders").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	left := "mongocas_verify_0badc0de_versioned"
	if _, err := db.Collection(left).InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	r := run(t, "", args(db, "verify", "--duration", "1s")...)
	wantCode(t, r, 2)
	if !strings.Contains(r.stderr, "holds 1 other collections (orders)") || !strings.Contains(r.stderr, "pass --yes") ||
		!strings.Contains(r.stderr, "(mongocas_verify_0badc0de_*): drop them with mongocas verify --drop-leftovers") {
		t.Errorf("no warning about the other collection and the leftovers:\n%s", r.stderr)
	}
	r = run(t, "", args(db, "verify", "--duration", "1s", "--yes", "--drop-leftovers", "--json")...)
	if r.code != 0 && r.code != 3 {
		wantCode(t, r, 0)
	}
	if !strings.Contains(r.stderr, "dropped 1 scratch collections an interrupted run left (mongocas_verify_0badc0de_*)") {
		t.Errorf("the leftovers were not dropped:\n%s", r.stderr)
	}
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil || len(names) != 1 || names[0] != "orders" {
		t.Errorf("collections after the run: %v %v (want only orders)", names, err)
	}
}

// proxied returns the URI of a fault proxy in front of db's server, through
// which every client of the verify binary goes, and the proxy.
func proxied(t *testing.T, db *mongotest.DB, opts *mongotest.FaultyOptions) (*mongotest.Faulty, string) {
	t.Helper()
	var mu sync.Mutex
	var proxyAddr string
	if opts == nil {
		opts = &mongotest.FaultyOptions{}
	}
	opts.ClientOptions = options.Client().SetPoolMonitor(&event.PoolMonitor{
		Event: func(e *event.PoolEvent) { mu.Lock(); proxyAddr = e.Address; mu.Unlock() },
	})
	f := db.Faulty(t, opts)
	mu.Lock()
	defer mu.Unlock()
	if proxyAddr == "" {
		t.Fatal("the fault proxy's address was not seen")
	}
	return f, "mongodb://" + proxyAddr + "/?directConnection=true&serverMonitoringMode=poll"
}

// verifyThrough runs verify --json through the proxy at uri.
func verifyThrough(t *testing.T, db *mongotest.DB, uri string, a ...string) (result, verifyReport) {
	t.Helper()
	r := run(t, "", append([]string{"verify", "--uri", uri, "--db", db.Name(), "--json"}, a...)...)
	var rep verifyReport
	if r.code == 0 || r.code == 1 || r.code == 3 {
		decode(t, r, &rep)
	}
	return r, rep
}

// sometimes returns a Match of the named commands on verify's scratch
// collections, true for a fraction p of them.
func sometimes(p float64, names ...string) mongotest.Match {
	var mu sync.Mutex
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	return func(c *mongotest.Command) bool {
		if !strings.HasPrefix(c.Collection, "mongocas_verify_") || !containsFold(names, c.Name) {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		return rnd.Float64() < p
	}
}

func containsFold(names []string, n string) bool {
	for _, x := range names {
		if strings.EqualFold(x, n) {
			return true
		}
	}
	return false
}

var writes = []string{"insert", "update", "delete", "findAndModify"}

// runs is how many times TestVerifyHoldsWithLostReplies runs verify:
// MONGOCAS_VERIFY_RUNS, default 2.
func runs() int {
	if n, err := strconv.Atoi(os.Getenv("MONGOCAS_VERIFY_RUNS")); err == nil && n > 0 {
		return n
	}
	return 2
}

// TestVerifyHoldsWithLostReplies: with 5% of the replies to every kind of
// write lost (the server applied the write), every guarantee holds, run
// after run, and the report counts the lost replies the library settled.
func TestVerifyHoldsWithLostReplies(t *testing.T) {
	db := mongotest.New(t)
	f, uri := proxied(t, db, nil)
	drop := f.DropReplies(1<<30, sometimes(0.05, writes...))
	for i := range runs() {
		r, rep := verifyThrough(t, db, uri, "--duration", "6s", "--clients", "3")
		t.Logf("run %d with lost replies (%d so far):\n%s%s", i+1, len(drop.Dropped()), r.stderr, r.stdout)
		wantCode(t, r, 0)
		if rep.LostReplies.Seen == 0 || rep.LostReplies.Settled == 0 {
			t.Errorf("run %d: %+v: no lost reply seen and settled", i+1, rep.LostReplies)
		}
	}
}

// TestVerifyCatchesStaleReads: a server that answers some reads with an
// earlier state fails the reads guarantee.
func TestVerifyCatchesStaleReads(t *testing.T) {
	db := mongotest.New(t)
	f, uri := proxied(t, db, nil)
	var mu sync.Mutex
	last := map[string]bson.Raw{}
	stale := sometimes(0.5, "find")
	f.RewriteReplies(1<<30, sometimes(1, "find"), func(c *mongotest.Command, reply bson.Raw) (bson.Raw, error) {
		key := c.Collection + string(c.Body.Lookup("filter").Value)
		mu.Lock()
		defer mu.Unlock()
		old, ok := last[key]
		last[key] = reply
		if ok && stale(c) {
			return old, nil
		}
		return reply, nil
	})
	wantBroken(t, db, uri, "stale reads", "reads:", "stale reads")
}

// wantBroken runs verify through the proxy at uri for 3 s and wants it to
// exit 1 with the check named by prefix broken, its detail holding detail.
func wantBroken(t *testing.T, db *mongotest.DB, uri, what, prefix, detail string) check {
	t.Helper()
	r, rep := verifyThrough(t, db, uri, "--duration", "3s", "--clients", "3")
	t.Logf("verify with %s:\n%s%s", what, r.stderr, r.stdout)
	wantCode(t, r, 1)
	c := rep.result(t, prefix)
	if c.Result != "broken" || !strings.Contains(c.Detail, detail) {
		t.Errorf("%s: %s (%s)", c.Name, c.Result, c.Detail)
	}
	return c
}

// TestVerifyCatchesALyingServer: a server that acknowledges some updates
// without applying them fails the linearizable-writes guarantee; one that
// answers an applied write with an error, too, with the history.
func TestVerifyCatchesALyingServer(t *testing.T) {
	t.Run("acknowledged, never applied", func(t *testing.T) {
		db := mongotest.New(t)
		f, uri := proxied(t, db, nil)
		ack, err := bson.Marshal(bson.D{{Key: "n", Value: 1}, {Key: "nModified", Value: 1}, {Key: "ok", Value: 1.0}})
		if err != nil {
			t.Fatal(err)
		}
		lie := f.AnswerInstead(1<<30, sometimes(0.1, "update"), ack)
		if c := wantBroken(t, db, uri, "a server that acknowledges updates it never applies", "versioned:", "not linearizable"); len(c.History) == 0 {
			t.Errorf("no history")
		}
		if len(lie.Matched()) == 0 {
			t.Errorf("no lie told")
		}
	})
	t.Run("applied, reported failed", func(t *testing.T) {
		db := mongotest.New(t)
		f, uri := proxied(t, db, nil)
		// One lie per run. A lie is visible only when it hides an applied
		// write from the history (a write that settles its own reply by
		// its write id, or a write outside the checked history, shows
		// nothing), so verify gets three runs to catch one.
		match := func(c *mongotest.Command) bool {
			return strings.HasSuffix(c.Collection, "_versioned") && (c.Name == "findAndModify" || c.Name == "update")
		}
		for try := 1; ; try++ {
			lie := f.ErrorAfterApply(match, mongotest.ServerError{Code: 2, CodeName: "BadValue", Errmsg: "mongotest: a reply replaced after the write applied"})
			r := run(t, "", "verify", "--uri", uri, "--db", db.Name(), "--duration", "3s", "--clients", "3")
			t.Logf("verify through the lying proxy, run %d:\n%s%s", try, r.stderr, r.stdout)
			if !lie.HasFired() {
				t.Fatal("the fault never fired")
			}
			if r.code == 0 && try < 3 {
				continue
			}
			wantCode(t, r, 1)
			if !strings.Contains(r.stdout, "versioned: linearizable writes (Modify, Guarded, Get): broken; the smallest history that shows it:") ||
				!strings.Contains(r.stdout, "failed, nothing written (") || !strings.Contains(r.stdout, "a reply replaced after the write applied") {
				t.Errorf("verify did not show the broken guarantee with its history")
			}
			return
		}
	})
}

// TestVerifyCatchesAFastClock: a server clock running 10% fast (hello's
// localTime) fails the clock guarantee, naming the rate.
func TestVerifyCatchesAFastClock(t *testing.T) {
	db := mongotest.New(t)
	f, uri := proxied(t, db, nil)
	base := time.Now()
	moveClock(f, func(actual time.Time) time.Time { return base.Add(actual.Sub(base) * 11 / 10) })
	c := wantBroken(t, db, uri, "a server clock 10% fast", "clock:", "the server clock runs at +0.")
	if !regexp.MustCompile(`runs at \+0\.(09|10?\b)`).MatchString(c.Detail) {
		t.Errorf("the rate named is not 10%%: %s", c.Detail)
	}
}

// moveClock rewrites hello's localTime in every reply through f's proxy.
func moveClock(f *mongotest.Faulty, move func(time.Time) time.Time) {
	f.RewriteReplies(1<<30, func(c *mongotest.Command) bool { return containsFold([]string{"hello", "isMaster"}, c.Name) },
		func(_ *mongotest.Command, reply bson.Raw) (bson.Raw, error) {
			var d bson.D
			if err := bson.Unmarshal(reply, &d); err != nil {
				return nil, err
			}
			for i, e := range d {
				if t, ok := e.Value.(bson.DateTime); ok && e.Key == "localTime" {
					d[i].Value = bson.NewDateTimeFromTime(move(t.Time()))
				}
			}
			return bson.Marshal(d)
		})
}

// TestVerifyShowsAUniformClockSkew: a server clock an hour ahead of this
// host's, at the same rate, harms no lease (only differences are used):
// verify passes, and shows the offset.
func TestVerifyShowsAUniformClockSkew(t *testing.T) {
	db := mongotest.New(t)
	f, uri := proxied(t, db, nil)
	moveClock(f, func(actual time.Time) time.Time { return actual.Add(time.Hour) })
	r, rep := verifyThrough(t, db, uri, "--duration", "4s", "--clients", "3")
	t.Logf("verify with the server clock an hour ahead:\n%s%s", r.stderr, r.stdout)
	// What this test checks is the clock line: a guarantee that a loaded
	// machine could not exercise in 4 s (exit 3) is not its concern, one
	// that broke is.
	if r.code == 3 && len(rep.Broken) == 0 {
		t.Logf("not tested in 4 s: %v", rep.NotTested)
	} else {
		wantCode(t, r, 0)
	}
	if c := rep.result(t, "clock:"); c.Result != "held" || !regexp.MustCompile(`offset \+(1h0m0|59m59\.99)`).MatchString(c.Detail) {
		t.Errorf("clock: %s (%s)", c.Result, c.Detail)
	}
}

// TestVerifyCatchesANonAtomicServer: FerretDB v1 without the serializing
// lock applies concurrent conditional updates non-atomically: leases
// overlap, writes are lost.
func TestVerifyCatchesANonAtomicServer(t *testing.T) {
	db := mongotest.New(t)
	if !db.Server.Serialized {
		t.Skipf("the %s backend runs concurrent writes atomically itself: no non-atomic server to build here", db.Server.Backend)
	}
	_, uri := proxied(t, db, &mongotest.FaultyOptions{Unserialized: true})
	r, rep := verifyThrough(t, db, uri, "--duration", "4s", "--clients", "4")
	t.Logf("verify on a non-atomic server:\n%s%s", r.stderr, r.stdout)
	wantCode(t, r, 1)
	if len(rep.Broken) == 0 {
		t.Fatalf("nothing broken")
	}
	for _, b := range rep.Broken {
		if !strings.HasPrefix(b, "versioned:") && !strings.HasPrefix(b, "lease:") && !strings.HasPrefix(b, "idempotency:") {
			t.Errorf("broken: %s, which a non-atomic server does not break", b)
		}
	}
}

// TestVerifyInterruptedDropsItsCollections: Ctrl-C in the middle of a run
// drops the run's scratch collections and says so.
func TestVerifyInterruptedDropsItsCollections(t *testing.T) {
	db := mongotest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	bin := binary(t)
	cmd := exec.CommandContext(ctx, bin, args(db, "verify", "--duration", "30s", "--clients", "2")...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), "verify: 1s of 30s") {
			break
		}
	}
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil || len(names) == 0 {
		t.Fatalf("no scratch collection while the run goes on: %v %v", names, err)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	rest, _ := io.ReadAll(stderr)
	out.Write(rest)
	err = cmd.Wait()
	if took := time.Since(sent); took > 10*time.Second {
		t.Errorf("the run went on for %v after the interrupt", took)
	}
	t.Logf("verify, interrupted:\n%s", out.String())
	if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() != 2 {
		t.Errorf("exit: %v, want status 2", err)
	}
	if !strings.Contains(out.String(), "mongocas verify: interrupted; dropped its") ||
		!strings.Contains(out.String(), "mongocas verify: interrupted: nothing was proven") {
		t.Errorf("no word of the interruption and the dropped collections")
	}
	names, err = db.ListCollectionNames(ctx, bson.D{})
	if err != nil || len(names) > 0 {
		t.Errorf("collections left: %v %v", names, err)
	}
}

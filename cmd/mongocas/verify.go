package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// Results of a check.
const (
	held        = "held"
	broken      = "broken"
	notTestable = "not testable"
	absent      = "absent"
)

// exitNotTested is verify's exit status when no guarantee broke but at least
// one could not be tested: not a pass.
const exitNotTested = 3

// The leases verify races: their TTL, and the margins a clock must stay
// within for them (lease's defaults for SafetyMargin and DriftRate).
const (
	leaseTTL    = time.Second
	leaseMargin = leaseTTL / 10
	driftRate   = 1e-4
)

// checkResult is one line of verify's report.
type checkResult struct {
	Name string `json:"name"`
	// Kind is "guarantee" (the library's promise, or what it rests on:
	// broken fails the run, not testable is not a pass) or "server" (a
	// server behaviour the library works around: for information).
	Kind    string   `json:"kind"`
	Result  string   `json:"result"`
	Detail  string   `json:"detail"`
	History []string `json:"history,omitempty"`
}

// lostReport is the report's count of lost replies, as the library's
// observer events told them.
type lostReport struct {
	Seen      int64 `json:"seen"`
	Settled   int64 `json:"settled"`
	Landed    int64 `json:"landed"`
	Resent    int64 `json:"resent"`
	NotLanded int64 `json:"notLanded"`
	Unknown   int64 `json:"unknown"`
}

type verifyReport struct {
	Database    string        `json:"database"`
	Server      string        `json:"server"`
	Scratch     string        `json:"scratchPrefix"`
	Clients     int           `json:"clients"`
	DurationSec float64       `json:"durationSeconds"`
	Operations  int64         `json:"operations"`
	LostReplies lostReport    `json:"lostReplies"`
	Clock       clockFigures  `json:"clock"`
	Checks      []checkResult `json:"checks"`
	Held        []string      `json:"held"`
	Broken      []string      `json:"broken"`
	NotTested   []string      `json:"notTested"`
}

// verifier runs the workloads of one verify run.
type verifier struct {
	prefix  string
	clients []*mongo.Database
	caps    store.Capabilities
	start   time.Time
	until   time.Time
	ops     atomic.Int64
	lost    lostReplies
	settles atomic.Int64 // Settle ids of the history
	clock   clockFigures
}

func (v *verifier) now() int64 { return int64(time.Since(v.start)) }

func (c *cli) verify(ctx context.Context, args []string) error {
	fs := c.flags("verify")
	duration := fs.Duration("duration", 20*time.Second, "how long the concurrent workloads run")
	nclients := fs.Int("clients", 4, "how many clients (connection pools) race")
	yes := fs.Bool("yes", false, "run on a database that holds other collections")
	dropLeft := fs.Bool("drop-leftovers", false, "drop the scratch collections interrupted runs left, then run")
	if pos, err := c.parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usageErr("verify takes no arguments, got %q", pos)
	}
	if *duration <= 0 || *nclients < 2 {
		return usageErr("--duration must be positive and --clients at least 2")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	k, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer k.close()
	setup, cancel := c.opCtx(ctx)
	defer cancel()
	if err := c.checkScratch(setup, k.db, *yes, *dropLeft); err != nil {
		return err
	}
	caps, err := store.Probe(setup, k.db)
	if err != nil {
		return fail(fmt.Errorf("probe the server: %w", err), "the user needs read and write access to the database")
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	v := &verifier{prefix: scratchPrefix + hex.EncodeToString(b[:]), caps: caps}
	defer func() { c.dropScratch(k.db, v.prefix, ctx.Err() != nil) }()
	beat := v.heartbeat(ctx, k.db)
	defer beat()
	v.clients = append(v.clients, k.db)
	for i := 1; i < *nclients; i++ {
		st, err := store.Connect(setup, c.uri, &store.Options{AppName: fmt.Sprintf("mongocas-verify-%d", i),
			ConnectTimeout: c.timeout, ServerSelectionTimeout: c.timeout})
		if err != nil {
			return connectError(err, c.timeout)
		}
		defer func() { _ = st.Close(context.Background()) }()
		v.clients = append(v.clients, st.Database(k.db.Name()))
	}
	fmt.Fprintf(c.errw, "verifying on %s %s (%s), %d clients, %v, scratch collections %s_*\n",
		caps.Server, caps.Version, topologyName(string(caps.Topology)), *nclients, *duration, v.prefix)

	// The server behaviours first (they are short), then the workloads, all at once.
	var checks []checkResult
	checks = append(checks, v.racingUpserts(setup), v.slice(setup), v.nowInWrites(setup))
	v.start = time.Now()
	v.until = v.start.Add(*duration)
	run, cancelRun := context.WithTimeout(ctx, *duration+2*time.Minute)
	defer cancelRun()
	stopProgress := c.progress(v, *duration)
	var wg sync.WaitGroup
	var mu sync.Mutex
	workloads := []func(context.Context) []checkResult{v.versioned, v.docLeases, v.namedLeases, v.firstUse,
		func(ctx context.Context) []checkResult { return []checkResult{v.majorityReads(ctx)} },
		func(ctx context.Context) []checkResult { return []checkResult{v.clocks(ctx)} }}
	workloadChecks := make([][]checkResult, len(workloads))
	for i, w := range workloads {
		wg.Go(func() {
			r := w(run)
			mu.Lock()
			workloadChecks[i] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	stopProgress()
	if ctx.Err() != nil {
		return &cliError{err: errors.New("interrupted: nothing was proven"), code: exitError}
	}
	guarantees := slices.Concat(workloadChecks...)
	checks = append(guarantees, checks...)

	r := verifyReport{Database: k.db.Name(), Server: string(caps.Server) + " " + caps.Version, Scratch: v.prefix,
		Clients: *nclients, DurationSec: duration.Seconds(), Operations: v.ops.Load(), Checks: checks,
		LostReplies: lostReport{Seen: v.lost.seen.Load(), Settled: v.lost.settled(), Landed: v.lost.landed.Load(),
			Resent: v.lost.resent.Load(), NotLanded: v.lost.notLanded.Load(), Unknown: v.lost.unknown.Load()},
		Clock: v.clock, Held: []string{}, Broken: []string{}, NotTested: []string{}}
	for _, ch := range checks {
		if ch.Kind != "guarantee" {
			continue
		}
		switch ch.Result {
		case held:
			r.Held = append(r.Held, ch.Name)
		case broken:
			r.Broken = append(r.Broken, ch.Name)
		default:
			r.NotTested = append(r.NotTested, ch.Name)
		}
	}
	switch {
	case len(r.Broken) > 0:
		c.status = exitProblem
	case len(r.NotTested) > 0:
		c.status = exitNotTested
	}
	if c.json {
		return c.printJSON(r)
	}
	tw := c.table()
	fmt.Fprintln(tw, "CHECK\tKIND\tRESULT\tDETAIL")
	for _, ch := range checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", ch.Name, ch.Kind, ch.Result, ch.Detail)
	}
	_ = tw.Flush()
	for _, ch := range checks {
		if len(ch.History) > 0 {
			fmt.Fprintf(c.out, "\n%s: %s; the smallest history that shows it:\n", ch.Name, ch.Result)
			for _, h := range ch.History {
				fmt.Fprintln(c.out, "  "+h)
			}
		}
	}
	fmt.Fprintf(c.out, "\n%d operations in %v; %s\n", r.Operations, *duration, &v.lost)
	fmt.Fprintf(c.out, "clock: %s\n", v.clock)
	fmt.Fprintf(c.out, "summary: %d held, %d broken, %d not tested\n", len(r.Held), len(r.Broken), len(r.NotTested))
	for _, l := range []struct {
		what  string
		names []string
	}{{"held", r.Held}, {"broken", r.Broken}, {"not tested", r.NotTested}} {
		if len(l.names) > 0 {
			fmt.Fprintf(c.out, "  %s: %s\n", l.what, strings.Join(l.names, "; "))
		}
	}
	switch c.status {
	case exitProblem:
		fmt.Fprintln(c.out, "a guarantee is broken on this deployment: see the history above; report it with the server's kind and version")
	case exitNotTested:
		fmt.Fprintln(c.out, "not every guarantee could be tested, so this run proves less than it should: raise --duration (exit status 3)")
	}
	return nil
}

// progress prints a line to stderr about once a second until stop is
// called: operations so far, lost replies settled, time left.
func (c *cli) progress(v *verifier, d time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			left := max(time.Until(v.until), 0).Round(time.Second)
			fmt.Fprintf(c.errw, "verify: %v of %v, %d operations, %d lost replies (%d settled), %v left\n",
				min(time.Since(v.start), d).Round(time.Second), d, v.ops.Load(), v.lost.seen.Load(), v.lost.settled(), left)
		}
	})
	return func() { close(done); wg.Wait() }
}

// outcome classifies a call's error: ok, a definite failure (nothing
// written), a failed guard, or unknown (it may have applied).
func outcome(err error) byte {
	switch {
	case err == nil:
		return resOK
	case errors.Is(err, versioned.ErrGuardFailed):
		return resGuard
	case errors.Is(err, store.ErrUnknownOutcome), store.IsAmbiguous(err), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled):
		return resUnknown
	}
	return resFail
}

// counter is the versioned document of the linearizability workload.
type counter struct {
	ID      string `bson:"_id"`
	N       int64  `bson:"n"`
	Version int64  `bson:"version"`
}

const (
	roundLen   = 700 * time.Millisecond
	docsPerRnd = 3
	initN      = 2
)

// versioned runs Modify (+1), Guarded (-1 if ≥ 1) and Get from every client
// on a few documents per round, then checks the history with porcupine.
func (v *verifier) versioned(ctx context.Context) []checkResult {
	name := "versioned: linearizable writes (Modify, Guarded, Get)"
	coll := v.prefix + "_versioned"
	repos := make([]*versioned.Repo[counter], len(v.clients))
	for i, db := range v.clients {
		r, err := versioned.New[counter](db.Collection(coll), &versioned.Options{Observer: &v.lost})
		if err != nil {
			return []checkResult{{name, "guarantee", notTestable, "versioned.New: " + err.Error(), nil}}
		}
		repos[i] = r
	}
	rounds := int(time.Until(v.until)/roundLen) + 1
	inserted := make([]atomic.Bool, rounds)
	insert := func(r int) error { // round r's documents, before anyone uses them
		if r >= rounds || inserted[r].Load() {
			return nil
		}
		for d := range docsPerRnd {
			if err := repos[0].Insert(ctx, &counter{ID: docID(r, d), N: initN}); err != nil && !errors.Is(err, versioned.ErrDuplicate) {
				return err
			}
		}
		inserted[r].Store(true)
		return nil
	}
	if err := insert(0); err != nil {
		return []checkResult{{name, "guarantee", notTestable, "could not insert the documents: " + err.Error(), nil}}
	}
	var mu sync.Mutex
	var history []op
	var insertMu sync.Mutex
	var wg sync.WaitGroup
	for ci := range v.clients {
		for g := range 2 {
			wg.Go(func() {
				rnd := mrand.New(mrand.NewPCG(uint64(ci), uint64(g))) //nolint:gosec // range indexes: never negative
				for time.Now().Before(v.until) && ctx.Err() == nil {
					r := int(time.Since(v.start) / roundLen)
					if r >= rounds {
						r = rounds - 1
					}
					insertMu.Lock()
					err := insert(r)
					if err == nil {
						err = insert(r + 1)
					}
					insertMu.Unlock()
					if err != nil {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					id := docID(r, rnd.IntN(docsPerRnd))
					in := vIn{Key: id}
					octx, cancel := context.WithTimeout(ctx, 15*time.Second)
					octx, tr := track(octx)
					call := v.now()
					var doc *counter
					switch x := rnd.IntN(10); {
					case x < 4:
						in.Op = 'm'
						doc, err = repos[ci].Modify(octx, id, func(c *counter) error { c.N++; return nil })
					case x < 7:
						in.Op = 't'
						doc, err = repos[ci].Guarded(octx, id, bson.D{{Key: "n", Value: bson.D{{Key: "$gte", Value: 1}}}},
							bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: -1}}}})
					default:
						in.Op = 'g'
						doc, err = repos[ci].Get(octx, id)
					}
					ret := v.now()
					cancel()
					v.ops.Add(1)
					out := vOut{Res: outcome(err)}
					if out.Res == resOK && doc != nil {
						out.N = doc.N
					}
					if out.Res == resUnknown {
						ret = never
					}
					if in.Op == 'g' && out.Res != resOK {
						continue // a failed read says nothing
					}
					entries := []op{{client: ci, call: call, ret: ret, in: in, out: out, err: errText(err)}}
					if in.Op == 't' && out.Res == resOK && tr.settledByReread() {
						// Guarded's documented contract after a lost reply a
						// re-read found landed: the write applied once, within
						// the call, and the document returned is the one
						// re-read after it, which may include later writes.
						in.Settle = int(v.settles.Add(1))
						entries = []op{
							{client: ci, call: call, ret: ret, in: in, out: vOut{Res: resLanded}},
							{client: ci, call: call + 1, ret: ret, in: vIn{Key: id, Op: 'r', Settle: in.Settle}, out: vOut{Res: resOK, N: doc.N}},
						}
					}
					mu.Lock()
					history = append(history, entries...)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	// A final read of every document used, after everything else.
	fctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for r := range rounds {
		if !inserted[r].Load() {
			continue
		}
		for d := range docsPerRnd {
			call := v.now()
			doc, err := repos[0].Get(fctx, docID(r, d))
			if err == nil {
				history = append(history, op{client: 0, call: call, ret: v.now(), in: vIn{Key: docID(r, d), Op: 'g'}, out: vOut{Res: resOK, N: doc.N}})
			}
		}
	}
	return []checkResult{checkHistory(name, history)}
}

func docID(r, d int) string { return fmt.Sprintf("r%d-d%d", r, d) }

func errText(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

// interval is one holder's time with a lease, on the local monotonic clock.
type interval struct {
	owner      string
	epoch      int64
	start, end time.Duration
}

// docLeases races TryAcquire on one document from every client; some holders
// "die" (never release). No two holders' intervals may overlap, epochs must
// grow, and a dead holder's fenced write after a takeover must change nothing.
func (v *verifier) docLeases(ctx context.Context) []checkResult {
	coll := v.prefix + "_leases"
	if err := insertScratch(ctx, v.clients[0].Collection(coll), bson.D{{Key: "_id", Value: "L"}, {Key: "stale", Value: bson.A{}}}); err != nil {
		return []checkResult{{"lease: one holder at a time (document lease)", "guarantee", notTestable, "insert: " + errText(err), nil}}
	}
	return v.leaseWorkload(ctx, "document lease", func(db *mongo.Database, owner string) (*lease.Manager, error) {
		return lease.New(db.Collection(coll), &lease.Options{TTL: leaseTTL, Owner: owner, Observer: &v.lost})
	}, coll)
}

func (v *verifier) namedLeases(ctx context.Context) []checkResult {
	coll := v.prefix + "_locks"
	return v.leaseWorkload(ctx, "named lease", func(db *mongo.Database, owner string) (*lease.Manager, error) {
		return lease.NewNamed(db.Collection(coll), &lease.Options{TTL: leaseTTL, Owner: owner, Observer: &v.lost})
	}, "")
}

func (v *verifier) leaseWorkload(ctx context.Context, what string, mk func(*mongo.Database, string) (*lease.Manager, error), fenceColl string) []checkResult {
	name := "lease: one holder at a time (" + what + ")"
	var mu sync.Mutex
	var ivs []interval
	var staleApplied, staleTried int
	var stale []string
	var mode lease.Mode
	var firstDies atomic.Bool
	failed, lastErr := 0, error(nil) // claims that failed other than as held
	var wg sync.WaitGroup
	for ci, db := range v.clients {
		m, err := mk(db, fmt.Sprintf("verify-%s-client%d", strings.Fields(what)[0], ci))
		if err != nil {
			return []checkResult{{name, "guarantee", notTestable, err.Error(), nil}}
		}
		wg.Go(func() {
			seed := uint64(ci) //nolint:gosec // a range index: never negative
			rnd := mrand.New(mrand.NewPCG(seed, 7))
			for time.Now().Add(1500*time.Millisecond).Before(v.until) && ctx.Err() == nil {
				l, err := m.TryAcquire(ctx, "L")
				v.ops.Add(1)
				if err != nil {
					if !errors.Is(err, lease.ErrHeld) {
						mu.Lock()
						failed++
						lastErr = err
						mu.Unlock()
					}
					time.Sleep(time.Duration(5+rnd.IntN(20)) * time.Millisecond)
					continue
				}
				start := time.Since(v.start)
				if md, err := m.Mode(ctx); err == nil {
					mu.Lock()
					mode = md
					mu.Unlock()
				}
				fence := l.Fence()
				time.Sleep(time.Duration(rnd.IntN(20)) * time.Millisecond)
				// The run's first holder dies, so that every run sees a
				// takeover early, then one in eight.
				dies := firstDies.CompareAndSwap(false, true) || rnd.IntN(8) == 0
				var end time.Duration
				if dies { // never released: its context must end before anyone else claims
					<-l.Done()
					end = min(time.Since(v.start), l.Deadline().Sub(v.start))
				} else {
					end = time.Since(v.start)
					if err := l.Release(ctx); err != nil && !errors.Is(err, lease.ErrLost) {
						end = min(end, l.Deadline().Sub(v.start)) // unknown: its context ended by the deadline anyway
					}
				}
				mu.Lock()
				ivs = append(ivs, interval{owner: l.Owner(), epoch: l.Epoch(), start: start, end: end})
				mu.Unlock()
				if dies && fenceColl != "" {
					// Once another claim is seen, the dead holder's fenced
					// write races the new holder's: it must change nothing,
					// as the stored document (read at majority) shows,
					// whatever the reply's counts say.
					c := db.Collection(fenceColl)
					for time.Now().Before(v.until) && ctx.Err() == nil {
						var rec struct {
							L leaseRecord `bson:"_lease"`
						}
						if c.FindOne(ctx, bson.D{{Key: "_id", Value: "L"}}).Decode(&rec) == nil && rec.L.Epoch > l.Epoch() {
							tag := fmt.Sprintf("%s@%d", l.Owner(), l.Epoch())
							_, werr := c.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: "L"}}, fence...),
								bson.D{{Key: "$push", Value: bson.D{{Key: "stale", Value: tag}}}})
							applied, rerr := v.storedHas(ctx, fenceColl, "L", "stale", tag)
							if rerr == nil {
								mu.Lock()
								staleTried++
								if applied {
									staleApplied++
									stale = append(stale, fmt.Sprintf("%s epoch %d: fenced write stored after epoch %d claimed (reply: %s)",
										l.Owner(), l.Epoch(), rec.L.Epoch, replyText(werr)))
								}
								mu.Unlock()
							}
							break
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
			}
		})
	}
	wg.Wait()
	slices.SortFunc(ivs, func(a, b interval) int { return int(a.start - b.start) })
	res := checkResult{Name: name, Kind: "guarantee"}
	overlaps := 0
	for i := range ivs {
		for j := i + 1; j < len(ivs) && ivs[j].start < ivs[i].end; j++ {
			overlaps++
			if len(res.History) == 0 {
				res.History = []string{showInterval(ivs[i]), showInterval(ivs[j])}
			}
		}
	}
	for i := 1; i < len(ivs) && len(res.History) == 0; i++ {
		if ivs[i].epoch <= ivs[i-1].epoch {
			res.History = []string{showInterval(ivs[i-1]), showInterval(ivs[i]), "epochs did not grow"}
			overlaps++
		}
	}
	switch {
	case len(ivs) < 2:
		res.Result, res.Detail = notTestable, fmt.Sprintf("only %d claims in the time given: raise --duration", len(ivs))
		if failed > 0 {
			res.Detail += fmt.Sprintf(" (%d claims failed, the last with: %s)", failed, errText(lastErr))
		}
	case overlaps > 0:
		res.Result, res.Detail = broken, fmt.Sprintf("%d overlaps of holders among %d claims (mode %s)", overlaps, len(ivs), mode)
	default:
		res.Result, res.Detail = held, fmt.Sprintf("%d claims, 0 overlaps, epochs grew; mode %s", len(ivs), mode)
	}
	out := []checkResult{res}
	if fenceColl != "" {
		f := checkResult{Name: "lease: a taken-over holder's fenced write changes nothing", Kind: "guarantee"}
		switch {
		case staleApplied > 0:
			f.Result, f.Detail, f.History = broken, fmt.Sprintf("%d of %d stale fenced writes were stored (read back at majority)", staleApplied, staleTried), stale
		case staleTried == 0:
			f.Result, f.Detail = notTestable, "no holder died and was taken over in the time given: raise --duration"
		default:
			f.Result, f.Detail = held, fmt.Sprintf("%d stale fenced writes raced takeovers; read back at majority, none was stored", staleTried)
		}
		out = append(out, f)
	}
	return out
}

func showInterval(iv interval) string {
	return fmt.Sprintf("%s epoch %d held from %.1fms to %.1fms", iv.owner, iv.epoch, ms(iv.start), ms(iv.end))
}

// firstUse races every client's first request of a new idempotency key: the
// function must run once, and every client must get its answer.
func (v *verifier) firstUse(ctx context.Context) []checkResult {
	name := "idempotency: a new key's racing first requests run it once"
	coll := v.prefix + "_keys"
	keys := make([]*idempotency.Keys, len(v.clients))
	for i, db := range v.clients {
		k, err := idempotency.New(db.Collection(coll), &idempotency.Options{TTL: 3 * time.Second, Owner: fmt.Sprintf("verify-keys-client%d", i), Observer: &v.lost})
		if err != nil {
			return []checkResult{{name, "guarantee", notTestable, err.Error(), nil}}
		}
		keys[i] = k
	}
	rounds, bad := 0, 0
	var hist []string
	for time.Now().Add(time.Second).Before(v.until) && ctx.Err() == nil {
		key := fmt.Sprintf("key-%d", rounds)
		rounds++
		var runs atomic.Int32
		answers := make([]string, len(keys))
		errs := make([]error, len(keys))
		var wg sync.WaitGroup
		for i, k := range keys {
			wg.Go(func() {
				for attempt := 0; attempt < 200 && time.Now().Before(v.until.Add(5*time.Second)) && ctx.Err() == nil; attempt++ {
					res, err := k.Do(ctx, key, []byte("same request"), func(ctx context.Context, _ *idempotency.Call) (idempotency.Result, error) {
						runs.Add(1)
						time.Sleep(15 * time.Millisecond)
						return idempotency.Result{Status: 200, Body: fmt.Appendf(nil, "ran by client %d", i)}, nil
					})
					v.ops.Add(1)
					if errors.Is(err, idempotency.ErrInProgress) {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					errs[i] = err
					if err == nil {
						answers[i] = string(res.Body)
					}
					return
				}
			})
		}
		wg.Wait()
		distinct := map[string]bool{}
		for i, a := range answers {
			if errs[i] == nil {
				distinct[a] = true
			}
		}
		if runs.Load() > 1 || len(distinct) > 1 {
			bad++
			if hist == nil {
				hist = append(hist, fmt.Sprintf("key %q: the function ran %d times", key, runs.Load()))
				for i := range answers {
					hist = append(hist, fmt.Sprintf("client %d got %q (error: %v)", i, answers[i], errs[i]))
				}
			}
		}
	}
	switch {
	case rounds == 0:
		return []checkResult{{name, "guarantee", notTestable, "no round fit in the time given: raise --duration", nil}}
	case bad > 0:
		return []checkResult{{name, "guarantee", broken, fmt.Sprintf("%d of %d keys ran more than once or answered differently", bad, rounds), hist}}
	}
	return []checkResult{{name, "guarantee", held, fmt.Sprintf("%d keys, %d clients racing each: one run, one answer", rounds, len(keys)), nil}}
}

// racingUpserts sends upserts of one new _id from every client at once:
// each reply must be the document stored, and no $inc may be lost.
func (v *verifier) racingUpserts(ctx context.Context) checkResult {
	res := checkResult{Name: "server: racing upserts of one new _id", Kind: "server"}
	coll := v.prefix + "_upserts"
	const rounds = 20
	bad := 0
	for r := range rounds {
		id := fmt.Sprintf("u%d", r)
		type reply struct {
			g   int
			n   int64
			by  int
			err error
		}
		replies := make([]reply, 2*len(v.clients))
		var wg sync.WaitGroup
		for g := range replies {
			wg.Go(func() {
				var doc struct {
					N  int64 `bson:"n"`
					By int   `bson:"by"`
				}
				err := v.clients[g%len(v.clients)].Collection(coll).FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: id}},
					bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}, {Key: "$setOnInsert", Value: bson.D{{Key: "by", Value: g}}}},
					options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&doc)
				replies[g] = reply{g: g, n: doc.N, by: doc.By, err: err}
			})
		}
		wg.Wait()
		var final struct {
			N  int64 `bson:"n"`
			By int   `bson:"by"`
		}
		if err := tries(ctx, func() error {
			return v.clients[0].Collection(coll).FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&final)
		}); err != nil {
			return checkResult{res.Name, "server", notTestable, "read back: " + errText(err), nil}
		}
		ok, unknown := int64(0), int64(0)
		seen := map[int64]bool{}
		wrong := false
		for _, rp := range replies {
			switch {
			case rp.err == nil:
				ok++
				if seen[rp.n] || rp.by != final.By {
					wrong = true
				}
				seen[rp.n] = true
			case store.IsDuplicateKey(rp.err): // refused: not applied
			default:
				unknown++
			}
		}
		if final.N < ok || final.N > ok+unknown || wrong {
			bad++
			if res.History == nil {
				for _, rp := range replies {
					if rp.err != nil {
						res.History = append(res.History, fmt.Sprintf("upsert %d of _id %q → error %s", rp.g, id, errText(rp.err)))
					} else {
						res.History = append(res.History, fmt.Sprintf("upsert %d of _id %q → {n: %d, by: %d}", rp.g, id, rp.n, rp.by))
					}
				}
				res.History = append(res.History, fmt.Sprintf("stored afterwards: {n: %d, by: %d}", final.N, final.By))
			}
		}
	}
	if bad > 0 {
		res.Result = broken
		res.Detail = fmt.Sprintf("%d of %d rounds answered a document that was not stored, or lost an $inc "+
			"(documentdb/documentdb#295); mongocas does not rely on it: deferred and idempotency insert, then update", bad, rounds)
		return res
	}
	res.Result = held
	res.Detail = fmt.Sprintf("%d rounds of %d concurrent upserts: every reply was the stored document, no $inc lost", rounds, 2*len(v.clients))
	return res
}

// lostOrNetwork reports whether err is a lost reply or a network failure:
// it says nothing about what the server does.
func lostOrNetwork(err error) bool {
	return err != nil && (store.IsAmbiguous(err) || store.IsNetwork(err) || store.IsTimeout(err))
}

// tries runs f until it returns something other than a lost reply or a
// network failure, at most 5 times: the server lines judge the server, not
// the network between.
func tries(ctx context.Context, f func() error) error {
	var err error
	for range 5 {
		if err = f(); !lostOrNetwork(err) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// insertScratch inserts doc into a scratch collection, trying again after a
// lost reply (a copy that landed before is a duplicate: fine).
func insertScratch(ctx context.Context, c *mongo.Collection, doc bson.D) error {
	err := tries(ctx, func() error { _, err := c.InsertOne(ctx, doc); return err })
	if store.IsDuplicateKey(err) {
		return nil
	}
	return err
}

// noReply is the detail of a server line the network kept from testing.
func noReply(what string, err error) string {
	return what + ": no reply after 5 tries (" + errText(err) + "); nothing is known of the server's behaviour"
}

// slice checks that $push with $slice keeps the last elements.
func (v *verifier) slice(ctx context.Context) checkResult {
	res := checkResult{Name: "server: $slice in $push", Kind: "server"}
	c := v.clients[0].Collection(v.prefix + "_server")
	if err := insertScratch(ctx, c, bson.D{{Key: "_id", Value: "slice"}, {Key: "a", Value: bson.A{}}}); err != nil {
		return checkResult{res.Name, "server", notTestable, "insert: " + errText(err), nil}
	}
	// Sent again after a lost reply, it keeps [3 4 5] all the same.
	err := tries(ctx, func() error {
		_, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: "slice"}}, bson.D{{Key: "$push", Value: bson.D{{Key: "a",
			Value: bson.D{{Key: "$each", Value: bson.A{1, 2, 3, 4, 5}}, {Key: "$slice", Value: -3}}}}}})
		return err
	})
	switch {
	case lostOrNetwork(err):
		return checkResult{res.Name, "server", notTestable, noReply("$push with $slice", err), nil}
	case err != nil:
		return checkResult{res.Name, "server", broken, "refused: " + errText(err), nil}
	}
	var doc struct {
		A []int `bson:"a"`
	}
	if err := tries(ctx, func() error { return c.FindOne(ctx, bson.D{{Key: "_id", Value: "slice"}}).Decode(&doc) }); err != nil {
		return checkResult{res.Name, "server", notTestable, "read back: " + errText(err), nil}
	}
	if !slices.Equal(doc.A, []int{3, 4, 5}) {
		res.Result = broken
		res.Detail = fmt.Sprintf("$push of 1..5 with $slice -3 kept %v: ignored; versioned's write-id lists of Update "+
			"and Guarded grow until the next Modify cuts them (correctness unaffected, versioned/DESIGN.md)", doc.A)
		return res
	}
	res.Result, res.Detail = held, "$push of 1..5 with $slice -3 kept [3 4 5]: write-id lists stay bounded"
	return res
}

// nowInWrites checks $$NOW in an update pipeline and $expr with $$NOW in a
// write filter: what lease's ModeServer uses.
func (v *verifier) nowInWrites(ctx context.Context) checkResult {
	res := checkResult{Name: "server: $$NOW in writes", Kind: "server"}
	db := v.clients[0]
	c := db.Collection(v.prefix + "_server")
	if err := insertScratch(ctx, c, bson.D{{Key: "_id", Value: "now"}}); err != nil {
		return checkResult{res.Name, "server", notTestable, "insert: " + errText(err), nil}
	}
	clock := store.NewServerClock(store.HelloSampler(db.Client()), nil)
	err := tries(ctx, func() error {
		_, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: "now"}}, mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "t", Value: "$$NOW"}}}}})
		return err
	})
	switch {
	case lostOrNetwork(err):
		return checkResult{res.Name, "server", notTestable, noReply("an update pipeline with $$NOW", err), nil}
	case err != nil:
		return checkResult{res.Name, "server", absent, "an update pipeline with $$NOW is refused here: lease uses ModeEstimated " +
			"(expiry judged on an estimate of the server's clock)", nil}
	}
	est, cerr := clock.Now(ctx)
	var doc struct {
		T time.Time `bson:"t"`
	}
	err = tries(ctx, func() error { return c.FindOne(ctx, bson.D{{Key: "_id", Value: "now"}}).Decode(&doc) })
	switch {
	case lostOrNetwork(err):
		return checkResult{res.Name, "server", notTestable, noReply("read back", err), nil}
	case err != nil || doc.T.IsZero():
		return checkResult{res.Name, "server", absent, "$$NOW in an update pipeline stored no date here: lease uses ModeEstimated", nil}
	}
	var ur *mongo.UpdateResult
	err = tries(ctx, func() error {
		var err error
		ur, err = c.UpdateOne(ctx, bson.D{{Key: "_id", Value: "now"}, {Key: "$expr", Value: bson.D{{Key: "$lte", Value: bson.A{"$t", "$$NOW"}}}}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "ok", Value: true}}}})
		return err
	})
	switch {
	case lostOrNetwork(err):
		return checkResult{res.Name, "server", notTestable, noReply("$expr with $$NOW", err), nil}
	case err != nil || ur.MatchedCount != 1:
		return checkResult{res.Name, "server", absent, "$expr with $$NOW in a write filter does not work here: lease uses ModeEstimated", nil}
	}
	if cerr == nil {
		if d := doc.T.Sub(est.Time); d > est.Bound+2*time.Second || d < -(est.Bound+2*time.Second) {
			return checkResult{res.Name, "server", broken, fmt.Sprintf("$$NOW stored %v, %v from the server's clock as hello reports it", doc.T, d), nil}
		}
	}
	res.Result, res.Detail = held, "an update pipeline stored $$NOW (agreeing with hello's clock) and $expr compared it: lease uses ModeServer"
	return res
}

// majorityColl returns client i's handle on a scratch collection read at
// read concern majority, as the packages' re-reads after a lost reply read.
func (v *verifier) majorityColl(i int, name string) *mongo.Collection {
	return v.clients[i%len(v.clients)].Collection(v.prefix+"_"+name, options.Collection().SetReadConcern(readconcern.Majority()))
}

// storedHas reads a scratch document at majority and reports whether its
// array field holds tag: what a write really stored, whatever its reply
// said.
func (v *verifier) storedHas(ctx context.Context, coll, id, field, tag string) (bool, error) {
	var doc bson.M
	c := v.clients[0].Collection(coll, options.Collection().SetReadConcern(readconcern.Majority()))
	err := tries(ctx, func() error { return c.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&doc) })
	if err != nil {
		return false, err
	}
	a, _ := doc[field].(bson.A)
	return slices.Contains(a, any(tag)), nil
}

// replyText says what a write's reply was, for a history.
func replyText(err error) string {
	if err == nil {
		return "ok"
	}
	return errText(err)
}

// majorityReads writes an ever larger number from one client and reads it
// back from the others, at read concern majority, for the whole run: a read
// that returns less than a write acknowledged before it began is a stale
// read, which would let a re-read after a lost reply settle it wrongly.
func (v *verifier) majorityReads(ctx context.Context) checkResult {
	res := checkResult{Name: "reads: a read sees every write acknowledged before it (read concern majority)", Kind: "guarantee"}
	w := v.clients[1].Collection(v.prefix + "_reads")
	if err := insertScratch(ctx, w, bson.D{{Key: "_id", Value: "r"}, {Key: "seq", Value: int64(0)}}); err != nil {
		res.Result, res.Detail = notTestable, "insert: "+errText(err)
		return res
	}
	level := "majority"
	var probe bson.M
	if err := tries(ctx, func() error {
		return v.majorityColl(2, "reads").FindOne(ctx, bson.D{{Key: "_id", Value: "r"}}).Decode(&probe)
	}); err != nil && !lostOrNetwork(err) {
		// Refused: the packages' re-reads then use the collection's read
		// concern, and so does this check.
		level = "the default (majority refused: " + errText(err) + ")"
	}
	read := func(i int) *mongo.Collection {
		if level == "majority" {
			return v.majorityColl(i, "reads")
		}
		return v.clients[i%len(v.clients)].Collection(v.prefix + "_reads")
	}
	var acked int64
	reads, stale, unknown := 0, 0, 0
	for seq := int64(1); time.Now().Before(v.until) && ctx.Err() == nil; seq++ {
		_, err := w.UpdateOne(ctx, bson.D{{Key: "_id", Value: "r"}}, bson.D{{Key: "$max", Value: bson.D{{Key: "seq", Value: seq}}}})
		v.ops.Add(1)
		switch {
		case err == nil:
			acked = seq
		case lostOrNetwork(err):
			unknown++ // it may have landed: $max keeps the number from going back
		}
		reader := 2 + int(seq)%(len(v.clients)-1) // every client but the writer, in turn
		var doc struct {
			Seq int64 `bson:"seq"`
		}
		err = read(reader).FindOne(ctx, bson.D{{Key: "_id", Value: "r"}}).Decode(&doc)
		v.ops.Add(1)
		if err != nil {
			continue
		}
		reads++
		if doc.Seq < acked {
			stale++
			if len(res.History) == 0 {
				res.History = []string{fmt.Sprintf("client 1 wrote seq=%d (acknowledged, w: majority)", acked),
					fmt.Sprintf("client %d then read seq=%d", reader%len(v.clients), doc.Seq)}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	switch {
	case stale > 0:
		res.Result, res.Detail = broken, fmt.Sprintf("%d of %d reads at %s missed a write acknowledged before they began: stale reads", stale, reads, level)
	case reads == 0:
		res.Result, res.Detail = notTestable, "no read completed in the time given: raise --duration"
	default:
		res.Result, res.Detail = held, fmt.Sprintf("%d reads at %s by other clients, each saw every write acknowledged before it", reads, level)
		if v.caps.Topology == store.Standalone {
			res.Detail += " (standalone: no rollback to guard against)"
		}
	}
	return res
}

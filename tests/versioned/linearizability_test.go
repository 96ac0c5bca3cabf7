package versioned_test

// A linearizability check of the versioned register: concurrent clients,
// each with its own Repo, some through fault proxies, run Get, Update,
// Modify and Guarded (and, less often, Delete and Insert, so a late copy can
// meet a re-inserted document) on two documents while replies are dropped,
// rewritten with errors, or writes are held and delivered late; porcupine
// then checks
// that the recorded history is linearizable against the register model in
// linearizability_model_test.go.

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

// linDoc is the register's document.
type linDoc struct {
	ID      string `bson:"_id"`
	Value   int64  `bson:"value"`
	Version int64  `bson:"version"`
}

// linFault arms one fault of a scenario on a fault client, for its next
// write.
type linFault func(f *mongotest.Faulty, rng *rand.Rand, m mongotest.Match) *mongotest.Fault

// linScenarios are the fault mixes, one subtest each, so a failure names
// the fault that produced it.
var linScenarios = []struct {
	name string
	arm  linFault
}{
	{"dropped replies", func(f *mongotest.Faulty, _ *rand.Rand, m mongotest.Match) *mongotest.Fault {
		return f.DropNextReply(m)
	}},
	{"late copies", func(f *mongotest.Faulty, _ *rand.Rand, m mongotest.Match) *mongotest.Fault {
		return f.HoldNext(m)
	}},
	{"write concern errors", func(f *mongotest.Faulty, rng *rand.Rand, m mongotest.Match) *mongotest.Fault {
		if rng.IntN(2) == 0 {
			return f.WriteConcernErrorNext(m, mongotest.WriteConcernTimeout())
		}
		return f.WriteConcernErrorNext(m, mongotest.WriteConcernError{
			Code: 189, CodeName: "PrimarySteppedDown", ErrorLabels: []string{"RetryableWriteError"},
		})
	}},
	{"error replies", func(f *mongotest.Faulty, rng *rand.Rand, m mongotest.Match) *mongotest.Fault {
		if rng.IntN(2) == 0 {
			return f.ErrorAfterApply(m, mongotest.NotWritablePrimary())
		}
		return f.ErrorBeforeApply(m, mongotest.NotWritablePrimary())
	}},
}

// Sizes of each scenario's run: small enough that the embedded backend
// finishes a scenario in seconds and porcupine in milliseconds.
const (
	linPlainClients = 2    // clients through the shared connection
	linFaultClients = 3    // clients each through a fault proxy of its own
	linOpsPerClient = 16   // operations each client calls
	linFaultRate    = 0.35 // share of a fault client's writes that meet a fault
)

var linKeys = []string{"a", "b"}

// linKinds weighs the operations: reads and the three writes often, Delete
// and Insert now and then.
var linKinds = []regKind{
	regGet, regGet, regGet, regGet,
	regUpdate, regUpdate, regUpdate,
	regModify, regModify, regModify,
	regGuarded, regGuarded, regGuarded,
	regDelete, regInsert,
}

func TestLinearizability(t *testing.T) {
	for _, sc := range linScenarios {
		t.Run(sc.name, func(t *testing.T) {
			runLinearizability(t, sc.arm)
		})
	}
}

// linRecorder collects the history and what the faults did.
type linRecorder struct {
	start time.Time

	mu      sync.Mutex
	history []porcupine.Operation
	results map[string]int
	notes   []string
}

func (r *linRecorder) now() int64 { return time.Since(r.start).Nanoseconds() }

func (r *linRecorder) add(client int, call, ret int64, in regInput, out regOutput, err error, fault string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if out.Result == resUnknown {
		ret = never // a copy of the write may land at any later time
	}
	var meta any
	if fault != "none" {
		meta = fault
	}
	if err != nil && out.Result != resOK {
		if meta == nil {
			meta = err.Error()
		} else {
			meta = fault + "; " + err.Error()
		}
	}
	r.history = append(r.history, porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out, Metadata: meta})
	r.results[in.Kind.String()+" "+out.Result.String()]++
	if out.Result == resFailed {
		r.notes = append(r.notes, "client "+itoa(client)+" "+in.Kind.String()+" "+in.Key+" failed ("+fault+"): "+err.Error())
	}
}

func (r *linRecorder) note(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, s)
}

func itoa(i int) string { return strconv.Itoa(i) }

// result reads an error the way the model does; see regResult.
func result(kind regKind, err error) regResult {
	switch {
	case err == nil:
		return resOK
	case errors.Is(err, versioned.ErrUnknownOutcome):
		return resUnknown
	case errors.Is(err, versioned.ErrNotFound):
		return resNotFound
	case (kind == regUpdate || kind == regDelete) && errors.Is(err, versioned.ErrConflict):
		return resRefused
	case kind == regGuarded && errors.Is(err, versioned.ErrGuardFailed):
		return resRefused
	case kind == regInsert && errors.Is(err, versioned.ErrDuplicate):
		return resRefused
	}
	return resFailed
}

func runLinearizability(t *testing.T, arm linFault) {
	t.Helper()
	db := mongotest.New(t)
	ctx := context.Background()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)

	setupRepo, err := versioned.New[linDoc](db.Collection("lin"), nil)
	require.NoError(t, err)
	for _, k := range linKeys {
		require.NoError(t, setupRepo.Insert(ctx, &linDoc{ID: k, Value: regInit.Value}))
	}

	type client struct {
		repo  *versioned.Repo[linDoc]
		fault *mongotest.Faulty // nil for a plain client
	}
	clients := make([]client, 0, linPlainClients+linFaultClients)
	for i := range linPlainClients + linFaultClients {
		coll := db.Collection("lin")
		var f *mongotest.Faulty
		if i >= linPlainClients {
			f = db.Faulty(t, nil)
			coll = f.Collection("lin")
		}
		repo, err := versioned.New[linDoc](coll, nil)
		require.NoError(t, err)
		clients = append(clients, client{repo: repo, fault: f})
	}

	rec := &linRecorder{start: time.Now(), results: map[string]int{}}
	var wg, deliveries sync.WaitGroup
	for ci, c := range clients {
		rng := rand.New(rand.NewPCG(uint64(seed), uint64(ci)))
		wg.Go(func() {
			var held []*mongotest.Fault // late copies not yet scheduled
			for seq := range linOpsPerClient {
				key := linKeys[rng.IntN(len(linKeys))]
				kind := linKinds[rng.IntN(len(linKinds))]
				octx, cancel := context.WithTimeout(ctx, 30*time.Second)
				var doc *linDoc
				if kind == regUpdate || kind == regDelete {
					// An Update or Delete writes what a Get read: the Get
					// is an operation of the history too.
					call := rec.now()
					d, err := c.repo.Get(octx, key)
					ret := rec.now()
					out := regOutput{Result: result(regGet, err)}
					if err == nil {
						out.Value, out.Version = d.Value, d.Version
					}
					rec.add(ci, call, ret, regInput{Key: key, Kind: regGet}, out, err, "none")
					if err != nil {
						cancel()
						continue
					}
					doc = d
				}
				var fault *mongotest.Fault
				what := "none"
				if c.fault != nil && kind != regGet && rng.Float64() < linFaultRate {
					fault = arm(c.fault, rng, mongotest.Writes("lin"))
					what = "fault armed"
				}
				in := regInput{Key: key, Kind: kind}
				var out regOutput
				call := rec.now()
				var err error
				switch kind {
				case regGet:
					var d *linDoc
					if d, err = c.repo.Get(octx, key); err == nil {
						out.Value, out.Version = d.Value, d.Version
					}
				case regUpdate:
					in.Expect = doc.Version
					in.Arg = 1_000_000 + int64(ci)*10_000 + int64(seq) // unique
					doc.Value = in.Arg
					if err = c.repo.Update(octx, doc); err == nil {
						out.Value, out.Version = doc.Value, doc.Version
					}
				case regModify:
					in.Arg = 1 + rng.Int64N(9)
					var d *linDoc
					if d, err = c.repo.Modify(octx, key, func(d *linDoc) error {
						d.Value += in.Arg
						return nil
					}); err == nil {
						out.Value, out.Version = d.Value, d.Version
					}
				case regDelete:
					in.Expect = doc.Version
					err = c.repo.Delete(octx, doc)
				case regInsert:
					in.Arg = 2_000_000 + int64(ci)*10_000 + int64(seq) // unique
					d := &linDoc{ID: key, Value: in.Arg}
					if err = c.repo.Insert(octx, d); err == nil {
						out.Value, out.Version = d.Value, d.Version
					}
				case regGuarded:
					in.Arg = 1 + rng.Int64N(150)
					var d *linDoc
					if d, err = c.repo.Guarded(octx, key,
						bson.D{{Key: "value", Value: bson.D{{Key: "$gte", Value: in.Arg}}}},
						bson.D{{Key: "$inc", Value: bson.D{{Key: "value", Value: -in.Arg}}}}); err == nil {
						out.Value, out.Version = d.Value, d.Version
					}
				}
				ret := rec.now()
				cancel()
				out.Result = result(kind, err)
				if fault != nil && fault.HasFired() {
					what = "fault fired"
					rec.mu.Lock()
					rec.results["faults fired"]++
					rec.mu.Unlock()
				}
				rec.add(ci, call, ret, in, out, err, what)
				if fault != nil {
					held = append(held, fault)
				}
				// Deliver the late copies whose hold fired, a little later,
				// while the other clients go on.
				var keep []*mongotest.Fault
				for _, h := range held {
					if !h.HasFired() {
						keep = append(keep, h)
						continue
					}
					delay := time.Duration(rng.IntN(250)) * time.Millisecond
					desc := "client " + itoa(ci) + " " + kind.String() + " " + key + " returned " + out.Result.String()
					deliveries.Go(func() {
						time.Sleep(delay)
						dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
						defer cancel()
						reply, err := h.Deliver(dctx)
						switch {
						case errors.Is(err, mongotest.ErrNothingHeld):
							// Not a hold: nothing to deliver.
						case err != nil:
							rec.note("late copy of " + desc + ": deliver failed: " + err.Error())
						default:
							rec.note("late copy of " + desc + ": the server applied it " + appliedCount(reply) + " time(s)")
						}
					})
				}
				held = keep
			}
		})
	}
	wg.Wait()
	deliveries.Wait()

	// Final reads, after every late copy has landed or not.
	for _, k := range linKeys {
		call := rec.now()
		d, err := setupRepo.Get(ctx, k)
		ret := rec.now()
		out := regOutput{Result: result(regGet, err)}
		if err == nil {
			out.Value, out.Version = d.Value, d.Version
		}
		require.Contains(t, []regResult{resOK, resNotFound}, out.Result, "final read: %v", err)
		rec.add(0, call, ret, regInput{Key: k, Kind: regGet}, out, err, "none")
	}

	t.Logf("%d operations: %v", len(rec.history), rec.results)
	for _, n := range rec.notes {
		t.Log(n)
	}
	checkLinearizable(t, rec.history, 20*time.Second)
}

// appliedCount reads how many documents a delivered write changed from its
// reply: n of an update, lastErrorObject.n of a findAndModify.
func appliedCount(reply bson.Raw) string {
	var r struct {
		N               *int32 `bson:"n"`
		LastErrorObject struct {
			N int32 `bson:"n"`
		} `bson:"lastErrorObject"`
		WriteErrors bson.Raw `bson:"writeErrors"`
	}
	if err := bson.Unmarshal(reply, &r); err != nil {
		return "? (" + err.Error() + ")"
	}
	n := r.LastErrorObject.N
	if r.N != nil {
		n = *r.N
	}
	return itoa(int(n))
}

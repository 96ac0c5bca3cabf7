package main_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

type verifyReport struct {
	Operations int64
	Checks     []struct {
		Name, Kind, Result, Detail string
		History                    []string
	}
}

// TestVerifyHolds: on the test server every guarantee holds, the server
// lines agree with store.Probe, and the scratch collections are dropped.
func TestVerifyHolds(t *testing.T) {
	db := mongotest.New(t)
	caps, err := store.Probe(context.Background(), db.Database)
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, "", args(db, "verify", "--duration", "4s", "--clients", "3")...)
	t.Logf("verify on the %s backend:\n%s%s", db.Server.Backend, r.stderr, r.stdout)
	wantCode(t, r, 0)
	for _, want := range []string{"versioned: linearizable writes", "lease: one holder at a time (document lease)",
		"lease: one holder at a time (named lease)", "lease: a taken-over holder's fenced write", "idempotency: a new key's racing first",
		"server: racing upserts", "server: $slice", "server: $$NOW in writes", "server: majority reads"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("no line %q", want)
		}
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
	if rep.Operations < 100 {
		t.Errorf("only %d operations", rep.Operations)
	}
	names, err := db.ListCollectionNames(context.Background(), bson.D{{Key: "name", Value: bson.D{{Key: "$regex", Value: "^mongocas_verify_"}}}})
	if err != nil || len(names) > 0 {
		t.Errorf("scratch collections left: %v %v", names, err)
	}
}

// TestVerifyCatchesALyingServer runs verify through mongotest's fault proxy,
// which answers one versioned write with an error although the server
// applied it: verify must report the guarantee broken, with the history.
func TestVerifyCatchesALyingServer(t *testing.T) {
	db := mongotest.New(t)
	var mu sync.Mutex
	var proxyAddr string
	f := db.Faulty(t, &mongotest.FaultyOptions{ClientOptions: options.Client().SetPoolMonitor(&event.PoolMonitor{
		Event: func(e *event.PoolEvent) { mu.Lock(); proxyAddr = e.Address; mu.Unlock() },
	})})
	mu.Lock()
	addr := proxyAddr
	mu.Unlock()
	if addr == "" {
		t.Fatal("the fault proxy's address was not seen")
	}
	// One lie per run. A lie is visible only when it hides an applied
	// write from the history (a write that settles its own reply by its
	// write id, or a write outside the checked history, shows nothing), so
	// verify gets three runs to catch one.
	match := func(c *mongotest.Command) bool {
		return strings.HasSuffix(c.Collection, "_versioned") && (c.Name == "findAndModify" || c.Name == "update")
	}
	uri := "mongodb://" + addr + "/?directConnection=true&serverMonitoringMode=poll"
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
}

package main_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/retry"
)

// queueWithDeadJobs makes a queue with two dead jobs of kind "charge", one
// completed "note", and one available "note" (enqueued while no worker runs).
func queueWithDeadJobs(t *testing.T, db *mongotest.DB) (*deferred.Queue, []bson.ObjectID) {
	t.Helper()
	ctx := context.Background()
	q, err := deferred.New(db.Collection("jobs"), &deferred.Options{PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	charge, err := deferred.Register(q, "charge", func(ctx context.Context, _ *deferred.Job, amount int64) error {
		return retry.Permanent(errors.New("partner said no to " + strconv.FormatInt(amount, 10)))
	})
	if err != nil {
		t.Fatal(err)
	}
	note, err := deferred.Register(q, "note", func(context.Context, *deferred.Job, string) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"ana", "bob"}
	dead := make([]bson.ObjectID, 0, len(keys))
	for i, key := range keys {
		id, err := charge.Enqueue(ctx, key, int64(10+i))
		if err != nil {
			t.Fatal(err)
		}
		dead = append(dead, id)
	}
	done, err := note.Enqueue(ctx, "ana", "hello")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- q.Run(runCtx) }()
	for _, id := range append(dead, done) {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		j, err := q.Wait(wctx, id, 20*time.Millisecond)
		cancel()
		if err != nil {
			t.Fatalf("job %s: %v", id.Hex(), err)
		}
		t.Logf("job %s (%s): %s", id.Hex(), j.Name, j.State)
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if _, err := note.Enqueue(ctx, "carl", "later"); err != nil {
		t.Fatal(err)
	}
	return q, dead
}

func counts(t *testing.T, q *deferred.Queue) map[deferred.State]int64 {
	t.Helper()
	c, err := q.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestJobs(t *testing.T) {
	db := mongotest.New(t)
	q, dead := queueWithDeadJobs(t, db)
	before := counts(t, q)

	r := run(t, "", args(db, "jobs", "--jobs", "jobs")...)
	wantCode(t, r, 0)
	t.Logf("jobs:\n%s", r.stdout)
	for _, want := range []string{"KIND", "DEAD", "charge", "note", "partner said no to 10", dead[0].Hex(), "oldest available job: "} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("jobs does not show %q", want)
		}
	}
	var rep struct {
		Counts map[string]int64
		Kinds  []struct {
			Kind   string
			Counts map[string]int64
		}
		OldestAge *float64 `json:"oldestAvailableAgeSeconds"`
		Dead      []struct {
			ID     string
			Kind   string
			Key    string
			Errors []struct{ Error string }
		}
	}
	decode(t, run(t, "", args(db, "jobs", "--jobs", "jobs", "--json")...), &rep)
	if rep.Counts["dead"] != 2 || rep.Counts["completed"] != 1 || rep.Counts["available"] != 1 {
		t.Errorf("counts %v: want 2 dead, 1 completed, 1 available", rep.Counts)
	}
	for _, k := range rep.Kinds {
		if k.Kind == "charge" && k.Counts["dead"] != 2 || k.Kind == "note" && k.Counts["completed"] != 1 {
			t.Errorf("kind %s: %v", k.Kind, k.Counts)
		}
	}
	if rep.OldestAge == nil || *rep.OldestAge < 0 || *rep.OldestAge > 120 {
		t.Errorf("oldest available age %v", rep.OldestAge)
	}
	if len(rep.Dead) != 2 || len(rep.Dead[0].Errors) == 0 || !strings.Contains(rep.Dead[0].Errors[0].Error, "partner said no") {
		t.Errorf("dead jobs %+v", rep.Dead)
	}

	show := run(t, "", args(db, "jobs", "--jobs", "jobs", "show", dead[1].Hex())...)
	wantCode(t, show, 0)
	if !strings.Contains(show.stdout, "attempt 1 at ") || !strings.Contains(show.stdout, "partner said no to 11") {
		t.Errorf("jobs show:\n%s", show.stdout)
	}

	// --dry-run and an unconfirmed run change nothing.
	dry := run(t, "", args(db, "jobs", "--jobs", "jobs", "requeue", "--kind", "charge", "--dry-run")...)
	wantCode(t, dry, 0)
	if !strings.Contains(dry.stdout, "dry run: would requeue 2 jobs; nothing was changed") {
		t.Errorf("dry run:\n%s", dry.stdout)
	}
	no := run(t, "", args(db, "jobs", "--jobs", "jobs", "requeue", dead[0].Hex())...)
	wantCode(t, no, 1)
	if !strings.Contains(no.stderr, "not confirmed: nothing was changed") {
		t.Errorf("without stdin:\n%s", no.stderr)
	}
	if after := counts(t, q); after[deferred.StateDead] != before[deferred.StateDead] || after[deferred.StateAvailable] != before[deferred.StateAvailable] {
		t.Fatalf("counts moved from %v to %v without a confirmed change", before, after)
	}

	yes := run(t, "", args(db, "jobs", "--jobs", "jobs", "requeue", dead[0].Hex(), "--yes")...)
	wantCode(t, yes, 0)
	if j, err := q.Job(context.Background(), dead[0]); err != nil || j.State != deferred.StateAvailable {
		t.Fatalf("after requeue: %v %v", j, err)
	}
	// Cancel by filter, confirmed on stdin.
	cancel := run(t, "y\n", args(db, "jobs", "--jobs", "jobs", "cancel", "--kind", "charge", "--state", "dead")...)
	wantCode(t, cancel, 0)
	if j, err := q.Job(context.Background(), dead[1]); err != nil || j.State != deferred.StateCancelled {
		t.Fatalf("after cancel: %v %v", j, err)
	}
	// A requeue the library refuses is reported per job, with status 1.
	bad := run(t, "", args(db, "jobs", "--jobs", "jobs", "requeue", dead[0].Hex(), "--yes", "--json")...)
	wantCode(t, bad, 1)
	if !strings.Contains(bad.stdout, "the job is available") {
		t.Errorf("requeue of an available job:\n%s", bad.stdout)
	}
}

func TestLeases(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	locks := db.Collection("locks")
	alive, err := lease.NewNamed(locks, &lease.Options{TTL: time.Minute, Owner: "alive-worker"})
	if err != nil {
		t.Fatal(err)
	}
	deadM, err := lease.NewNamed(locks, &lease.Options{TTL: time.Minute, Owner: "dead-worker"})
	if err != nil {
		t.Fatal(err)
	}
	live, err := alive.TryAcquire(ctx, "nightly-report")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = live.Release(ctx) }()
	gone, err := deadM.TryAcquire(ctx, "invoice-run")
	if err != nil {
		t.Fatal(err)
	}
	users := db.Collection("users")
	if _, err := users.InsertOne(ctx, bson.D{{Key: "_id", Value: "u1"}, {Key: "n", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	docM, err := lease.New(users, &lease.Options{TTL: time.Minute, Owner: "dead-doc-worker"})
	if err != nil {
		t.Fatal(err)
	}
	docLease, err := docM.TryAcquire(ctx, "u1")
	if err != nil {
		t.Fatal(err)
	}

	r := run(t, "", args(db, "leases", "--leases", "locks", "--coll", "users")...)
	wantCode(t, r, 0)
	t.Logf("leases:\n%s", r.stdout)
	var rep struct {
		Leases []struct {
			Kind, ID, Holder, State string
			Epoch                   int64
			TimeLeftMs              float64
		}
	}
	decode(t, run(t, "", args(db, "leases", "--leases", "locks", "--coll", "users", "--json")...), &rep)
	if len(rep.Leases) != 3 {
		t.Fatalf("leases: %+v", rep.Leases)
	}
	for _, l := range rep.Leases {
		want := map[string]int64{"nightly-report": live.Epoch(), "invoice-run": gone.Epoch(), "u1": docLease.Epoch()}[l.ID]
		if l.Epoch != want || l.State != "held" || l.TimeLeftMs < 50_000 || l.TimeLeftMs > 61_000 {
			t.Errorf("lease %+v: want epoch %d, held, about a minute left", l, want)
		}
	}

	release := func(stdin string, a ...string) result {
		return run(t, stdin, args(db, append([]string{"leases", "release"}, a...)...)...)
	}
	ep := func(l *lease.Lease) string { return strconv.FormatInt(l.Epoch(), 10) }
	wantCode(t, release("", "invoice-run", "--leases", "locks", "--owner", "dead-worker", "--epoch", ep(gone)), 2) // no --force
	dry := release("", "invoice-run", "--leases", "locks", "--force", "--owner", "dead-worker", "--epoch", ep(gone), "--dry-run")
	wantCode(t, dry, 0)
	if !strings.Contains(dry.stdout, "dry run: would release") {
		t.Errorf("dry run: %s", dry.stdout)
	}
	wantCode(t, release("", "invoice-run", "--leases", "locks", "--force", "--owner", "dead-worker", "--epoch", ep(gone)), 1) // not confirmed
	if err := gone.Renew(ctx); err != nil {
		t.Fatalf("the dry run or the unconfirmed release hurt the lease: %v", err)
	}
	// The wrong epoch (a holder that is not the one named): nothing changes.
	wrong := release("", "nightly-report", "--leases", "locks", "--force", "--owner", "alive-worker", "--epoch", strconv.FormatInt(live.Epoch()-1, 10), "--yes")
	wantCode(t, wrong, 1)
	if !strings.Contains(wrong.stdout, "nothing changed") {
		t.Errorf("wrong epoch: %s", wrong.stdout)
	}
	if err := live.Renew(ctx); err != nil {
		t.Fatalf("a fenced release of another epoch hurt the live holder: %v", err)
	}

	ok := release("", "invoice-run", "--leases", "locks", "--force", "--owner", "dead-worker", "--epoch", ep(gone), "--yes")
	wantCode(t, ok, 0)
	if !strings.Contains(ok.stdout, "released lease invoice-run") {
		t.Errorf("release: %s", ok.stdout)
	}
	if err := gone.Renew(ctx); !errors.Is(err, lease.ErrLost) {
		t.Errorf("the released holder renewed: %v", err)
	}
	next, err := alive.TryAcquire(ctx, "invoice-run")
	if err != nil {
		t.Fatalf("after the forced release the name is not free: %v", err)
	}
	if next.Epoch() <= gone.Epoch() {
		t.Errorf("epoch %d after %d", next.Epoch(), gone.Epoch())
	}
	_ = next.Release(ctx)

	// A document lease: released, and the old holder's fenced write matches nothing.
	fence := docLease.Fence()
	wantCode(t, release("", "u1", "--coll", "users", "--force", "--owner", "dead-doc-worker", "--epoch", ep(docLease), "--yes"), 0)
	res, err := users.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: "u1"}}, fence...), bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}})
	if err != nil || res.MatchedCount != 0 {
		t.Errorf("the old holder's fenced write after the release: %+v %v", res, err)
	}
	again := release("", "u1", "--coll", "users", "--force", "--owner", "dead-doc-worker", "--epoch", ep(docLease), "--yes")
	wantCode(t, again, 0)
	if !strings.Contains(again.stdout, "is free") {
		t.Errorf("second release: %s", again.stdout)
	}
}

func TestKeys(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	keys, err := idempotency.New(db.Collection("idem"), nil)
	if err != nil {
		t.Fatal(err)
	}
	fp := []byte("POST /orders {\"sku\":\"a\"}")
	_, err = keys.Do(ctx, "order-1", fp, func(context.Context, *idempotency.Call) (idempotency.Result, error) {
		return idempotency.Result{Status: 201, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte(`{"id":1}`)}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = keys.Do(ctx, "order-2", fp, func(context.Context, *idempotency.Call) (idempotency.Result, error) {
		return idempotency.Result{}, errors.New("partner down")
	})
	if err == nil {
		t.Fatal("want the function's error")
	}
	r := run(t, "", args(db, "keys", "--keys", "idem", "order-1")...)
	wantCode(t, r, 0)
	t.Logf("keys:\n%s", r.stdout)
	var rep struct {
		State            string
		Fingerprint      string `json:"fingerprintSha256"`
		Status           int
		Header           map[string]string
		Body             string
		AgeSeconds       float64
		ExpiresInSeconds float64
		ExpireAt         time.Time
	}
	decode(t, run(t, "", args(db, "keys", "--keys", "idem", "order-1", "--json")...), &rep)
	sum := sha256.Sum256(fp)
	if rep.State != "completed" || rep.Status != 201 || rep.Body != `{"id":1}` || rep.Header["Location"] != "/orders/1" ||
		rep.Fingerprint != hex.EncodeToString(sum[:]) {
		t.Errorf("keys order-1: %+v", rep)
	}
	if rep.AgeSeconds < -1 || rep.AgeSeconds > 60 || rep.ExpiresInSeconds < 23*3600 || rep.ExpiresInSeconds > 24*3600+60 {
		t.Errorf("age %v s, expires in %v s: want fresh, in about 24h", rep.AgeSeconds, rep.ExpiresInSeconds)
	}
	decode(t, run(t, "", args(db, "keys", "--keys", "idem", "order-2", "--json")...), &rep)
	if rep.State != "failed" {
		t.Errorf("keys order-2: %+v", rep)
	}
	missing := run(t, "", args(db, "keys", "--keys", "idem", "order-3")...)
	wantCode(t, missing, 1)
	if !strings.Contains(missing.stderr, "no record of key") {
		t.Errorf("unknown key: %s", missing.stderr)
	}
}

func TestMoves(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	accounts := db.Collection("accounts")
	if _, err := accounts.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: "ana"}, {Key: "balance", Value: int64(100)}, {Key: "version", Value: int64(1)}},
		bson.D{{Key: "_id", Value: "ben"}, {Key: "balance", Value: int64(0)}, {Key: "version", Value: int64(1)}},
	}); err != nil {
		t.Fatal(err)
	}
	empty := run(t, "", args(db, "moves", "--coll", "accounts")...)
	wantCode(t, empty, 0)
	if !strings.Contains(empty.stdout, "no moves in flight or awaiting clean-up in accounts") {
		t.Errorf("before any move:\n%s", empty.stdout)
	}

	// Two moves whose relay has not run yet: their value is in flight.
	q, err := deferred.New(db.Collection("jobs"), &deferred.Options{PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m, err := move.New(ctx, q, accounts, &move.Options{Field: "balance"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := m.Move(ctx, "ana", "ben", 30, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Move(ctx, "ana", "ben", 12, nil); err != nil {
		t.Fatal(err)
	}
	r := run(t, "", args(db, "moves", "--coll", "accounts")...)
	wantCode(t, r, 0)
	t.Logf("moves:\n%s", r.stdout)
	for _, want := range []string{"2 pending (amount 42 in flight), 0 records of settled moves awaiting clean-up", "oldest pending: ",
		"MOVE", first.Hex() + "  pending  ana   ben  30"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("moves does not show %q", want)
		}
	}
	var rep struct {
		Pending       int
		PendingAmount int64 `json:"pendingAmount"`
		Stuck         int
		Entries       []struct {
			Move, Stage, From, To string
			Amount                int64
			AgeSeconds            float64 `json:"ageSeconds"`
		}
	}
	decode(t, run(t, "", args(db, "moves", "--coll", "accounts", "--json", "--limit", "1")...), &rep)
	if rep.Pending != 2 || rep.PendingAmount != 42 || rep.Stuck != 0 || len(rep.Entries) != 1 ||
		rep.Entries[0].Move != first.Hex() || rep.Entries[0].Stage != "pending" || rep.Entries[0].Amount != 30 ||
		rep.Entries[0].AgeSeconds < 0 || rep.Entries[0].AgeSeconds > 120 {
		t.Errorf("moves --json --limit 1: %+v", rep)
	}
	stuck := run(t, "", args(db, "moves", "--coll", "accounts", "--stuck", "1ns")...)
	wantCode(t, stuck, 1)
	if !strings.Contains(stuck.stdout, "2 moves pending longer than 1ns") {
		t.Errorf("--stuck:\n%s", stuck.stdout)
	}
	for _, bad := range [][]string{{"moves"}, {"moves", "--coll", "accounts", "--state-field", "$where"}, {"moves", "--coll", "accounts", "extra"}} {
		wantCode(t, run(t, "", args(db, bad...)...), 2)
	}

	// Once the relay ran, nothing is in flight.
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- q.Run(runCtx) }()
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := m.Status(ctx, "ana", first)
		if err != nil {
			t.Fatal(err)
		}
		left, err := move.Unsettled(ctx, accounts, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		if st == move.Done && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: %s, %d records left", st, len(left))
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	done := run(t, "", args(db, "moves", "--coll", "accounts")...)
	wantCode(t, done, 0)
	if !strings.Contains(done.stdout, "no moves in flight") {
		t.Errorf("after the relay:\n%s", done.stdout)
	}
}

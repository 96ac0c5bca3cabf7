package readme_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// sections returns the pieces of snippets_test.go between "// README: name"
// and "// README end", in order, trimmed.
func sections(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("snippets_test.go")
	require.NoError(t, err)
	re := regexp.MustCompile(`(?s)// README: [^\n]*\n(.*?)\n// README end\n`)
	ms := re.FindAllStringSubmatch(string(src), -1)
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, strings.TrimSpace(m[1]))
	}
	return out
}

// readmeBlocks returns the ```go blocks of the repository's README.md, in
// order, trimmed.
func readmeBlocks(t *testing.T) []string {
	t.Helper()
	dir, err := filepath.Abs(".")
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "README.md")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
				break
			}
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "no README.md beside a .git above the test")
		dir = parent
	}
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	require.NoError(t, err)
	re := regexp.MustCompile("(?s)```go\n(.*?)```")
	ms := re.FindAllStringSubmatch(string(readme), -1)
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, strings.TrimSpace(m[1]))
	}
	return out
}

// TestREADMEMatches: the README's Go code is this package's, verbatim and in
// order, so what a newcomer copies compiles and is run by the examples and
// tests here.
func TestREADMEMatches(t *testing.T) {
	t.Parallel()
	want := sections(t)
	require.Len(t, want, 8, "snippets_test.go must mark eight README sections")
	got := readmeBlocks(t)
	require.Len(t, got, len(want), "README.md must have one ```go block per section of snippets_test.go")
	for i := range want {
		require.Equal(t, want[i], got[i], "README ```go block %d differs from section %d of snippets_test.go", i+1, i+1)
	}
}

// newDB returns a fresh database on mongotest's server and its drop.
func newDB(label string) (*mongotest.DB, func()) {
	db, drop, err := mongotest.Open(context.Background(), label)
	if err != nil {
		panic(err)
	}
	return db, func() { _ = drop(context.Background()) }
}

func ExampleTake() {
	db, drop := newDB("take")
	defer drop()
	ctx := context.Background()
	items, err := versioned.New[Item](db.Collection("items"), nil)
	if err != nil {
		panic(err)
	}
	if err := items.Insert(ctx, &Item{SKU: "mug", Stock: 5}); err != nil {
		panic(err)
	}
	fmt.Println(Take(ctx, items, "mug", 3))
	fmt.Println(Take(ctx, items, "mug", 3))
	// Output:
	// <nil>
	// sold out
}

func ExampleSpend() {
	db, drop := newDB("spend")
	defer drop()
	ctx := context.Background()
	wallets, err := versioned.New[Wallet](db.Collection("wallets"), nil)
	if err != nil {
		panic(err)
	}
	if err := wallets.Insert(ctx, &Wallet{ID: "ana", Balance: 100}); err != nil {
		panic(err)
	}
	w, err := Spend(ctx, wallets, "ana", "2025-01-02", 30, 50)
	fmt.Println(w.Balance, w.SpentToday, err)
	_, err = Spend(ctx, wallets, "ana", "2025-01-02", 30, 50)
	fmt.Println(errors.Is(err, ErrDeclined))
	w, err = Spend(ctx, wallets, "ana", "2025-01-03", 30, 50)
	fmt.Println(w.Balance, w.SpentToday, err)
	// Output:
	// 70 30 <nil>
	// true
	// 40 30 <nil>
}

// ExampleNewWallets: at Info the logger prints nothing while all goes well
// (a declined payment is an answer, not a failure); the counters count.
func ExampleNewWallets() {
	db, drop := newDB("observed")
	defer drop()
	ctx := context.Background()
	var counts observe.Counters
	logger := slog.New(slog.NewTextHandler(os.Stdout, nil)) // Info; a line here would fail the example
	wallets, err := NewWallets(db.Collection("wallets"), logger, &counts)
	if err != nil {
		panic(err)
	}
	if err := wallets.Insert(ctx, &Wallet{ID: "ana", Balance: 100}); err != nil {
		panic(err)
	}
	_, err = Spend(ctx, wallets, "ana", "2025-01-02", 30, 50)
	fmt.Println(err)
	_, err = Spend(ctx, wallets, "ana", "2025-01-02", 30, 50)
	fmt.Println(errors.Is(err, ErrDeclined))
	fmt.Println(counts.Count(observe.OpEnd), counts.Failed())
	// Output:
	// <nil>
	// true
	// 3 0
}

// recordingPartner is a Partner that remembers the calls it had.
type recordingPartner struct {
	mu   sync.Mutex
	keys []string
}

func (p *recordingPartner) SetPrimary(_ context.Context, key, _, _ string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys = append(p.keys, key)
	return nil
}

func ExampleChangePrimary() {
	db, drop := newDB("change_primary")
	defer drop()
	ctx := context.Background()
	users := db.Collection("users")
	if _, err := users.InsertOne(ctx, bson.D{{Key: "_id", Value: "user-42"}, {Key: "primary", Value: "a"}}); err != nil {
		panic(err)
	}
	leases, err := lease.New(users, &lease.Options{TTL: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	partner := &recordingPartner{}
	fmt.Println(ChangePrimary(ctx, leases, users, partner, "user-42", "b"))
	var u struct {
		Primary string `bson:"primary"`
	}
	if err := users.FindOne(ctx, bson.D{{Key: "_id", Value: "user-42"}}).Decode(&u); err != nil {
		panic(err)
	}
	fmt.Println(u.Primary, len(partner.keys))
	// Output:
	// <nil>
	// b 1
}

// TestChangePrimaryOneAtATime: concurrent changes for one user reach the
// partner one at a time, each with its own idempotency key.
func TestChangePrimaryOneAtATime(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	users := db.Collection("users")
	_, err := users.InsertOne(t.Context(), bson.D{{Key: "_id", Value: "u"}})
	require.NoError(t, err)
	leases, err := lease.New(users, &lease.Options{TTL: 30 * time.Second})
	require.NoError(t, err)
	p := &exclusivePartner{}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() { errs <- ChangePrimary(t.Context(), leases, users, p, "u", strconv.Itoa(i)) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err) // Do waits for the lease
	}
	require.Zero(t, p.overlaps)
	require.Len(t, p.keys, 8)
	seen := map[string]bool{}
	for _, k := range p.keys {
		require.False(t, seen[k], "idempotency key %s used twice", k)
		seen[k] = true
	}
}

// exclusivePartner counts calls that overlap another call.
type exclusivePartner struct {
	recordingPartner
	inside, overlaps int
}

func (p *exclusivePartner) SetPrimary(ctx context.Context, key, user, identity string) error {
	p.mu.Lock()
	p.inside++
	if p.inside > 1 {
		p.overlaps++
	}
	p.mu.Unlock()
	time.Sleep(5 * time.Millisecond) // a slow partner
	p.mu.Lock()
	p.inside--
	p.mu.Unlock()
	return p.recordingPartner.SetPrimary(ctx, key, user, identity)
}

// TestTransfer: a transfer moves the money or, declined, moves nothing.
func TestTransfer(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	db.Require(t, mongotest.Transactions)
	ctx := t.Context()
	wallets, err := versioned.New[Wallet](db.Collection("wallets"), nil)
	require.NoError(t, err)
	require.NoError(t, wallets.Insert(ctx, &Wallet{ID: "a", Balance: 100}))
	require.NoError(t, wallets.Insert(ctx, &Wallet{ID: "b", Balance: 0}))

	require.NoError(t, Transfer(ctx, db.Client(), wallets, "a", "b", 60))
	require.ErrorIs(t, Transfer(ctx, db.Client(), wallets, "a", "b", 60), ErrDeclined)
	balance := func(id string) int64 {
		w, err := wallets.Get(ctx, id)
		require.NoError(t, err)
		return w.Balance
	}
	require.Equal(t, int64(40), balance("a"))
	require.Equal(t, int64(60), balance("b"))
}

// countingPSP is a PSP that charges once per idempotency key and declines
// amounts over 1000.
type countingPSP struct {
	mu      sync.Mutex
	charges map[string]string
}

func (p *countingPSP) Charge(_ context.Context, key, order string, amount int64) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if amount > 1000 {
		return "", ErrDeclined
	}
	if id, ok := p.charges[key]; ok {
		return id, nil
	}
	id := fmt.Sprintf("ch_%d_%s", len(p.charges)+1, order)
	p.charges[key] = id
	return id, nil
}

func ExampleChargeOnce() {
	db, drop := newDB("charge")
	defer drop()
	ctx := context.Background()
	keys, err := idempotency.New(db.Collection("idempotency_keys"), nil)
	if err != nil {
		panic(err)
	}
	psp := &countingPSP{charges: map[string]string{}}
	for range 2 {
		res, err := ChargeOnce(ctx, keys, psp, "3f9a", "order-1", 250)
		fmt.Println(res.Status, string(res.Body), res.Replayed, err)
	}
	_, err = ChargeOnce(ctx, keys, psp, "3f9a", "order-1", 999)
	fmt.Println(errors.Is(err, idempotency.ErrMismatch))
	res, err := ChargeOnce(ctx, keys, psp, "77c2", "order-2", 5000)
	fmt.Println(res.Status, err, len(psp.charges))
	// Output:
	// 201 ch_1_order-1 false <nil>
	// 201 ch_1_order-1 true <nil>
	// true
	// 402 <nil> 1
}

// TestServeSpend: the change applies now (200); when another instance
// changes the wallet between Modify's read and its write and the retries
// (one attempt here) run out, it is queued (202 with the job) and applied
// later, once; a change the balance does not cover is 402, an unknown
// wallet 404.
func TestServeSpend(t *testing.T) {
	t.Parallel()
	db := mongotest.New(t)
	ctx := t.Context()
	f := db.Faulty(t, nil) // this instance's client
	wallets, err := versioned.New[Wallet](f.Collection("wallets"), &versioned.Options{Retry: retry.Policy{MaxAttempts: 1}})
	require.NoError(t, err)
	other, err := versioned.New[Wallet](db.Collection("wallets"), nil) // another instance's
	require.NoError(t, err)
	require.NoError(t, wallets.Insert(ctx, &Wallet{ID: "ana", Balance: 100}))
	jobs, err := deferred.New(f.Collection("jobs"), &deferred.Options{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	spend, err := NewSpendLater(jobs, wallets)
	require.NoError(t, err)
	serve := func(id string, amount int64) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		ServeSpend(rec, httptest.NewRequestWithContext(ctx, http.MethodPost, "/wallets/"+id+"/spend", nil), spend, id, amount)
		return rec
	}

	rec := serve("ana", 10)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.JSONEq(t, `{"id":"ana","balance":90}`, rec.Body.String())

	// Another instance spends 5 between this one's read and its write.
	writes := mongotest.Writes("wallets")
	var once sync.Once
	f.ErrorBeforeApply(func(c *mongotest.Command) bool {
		if writes(c) {
			once.Do(func() {
				_, err := other.Modify(ctx, "ana", func(w *Wallet) error { w.Balance -= 5; return nil })
				require.NoError(t, err)
			})
		}
		return false // the write goes on, and meets the other's version
	}, mongotest.ServerError{})
	rec = serve("ana", 20)
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	loc := rec.Header().Get("Location")
	require.True(t, strings.HasPrefix(loc, "/jobs/"), loc)
	id, err := bson.ObjectIDFromHex(strings.TrimPrefix(loc, "/jobs/"))
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = jobs.Run(runCtx) })
	defer func() { stop(); wg.Wait() }()
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	job, err := jobs.Wait(waitCtx, id, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, deferred.StateCompleted, job.State)
	w, err := other.Get(ctx, "ana")
	require.NoError(t, err)
	require.Equal(t, int64(100-10-5-20), w.Balance, "the queued change applied once")

	require.Equal(t, http.StatusPaymentRequired, serve("ana", 1000).Code)
	require.Equal(t, http.StatusNotFound, serve("bob", 1).Code)
}

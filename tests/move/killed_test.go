package move_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/move"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// childEnv, set to "uri database", makes this test binary a process that
// moves value among the accounts of that database until it is killed
// (TestMain runs moverChild instead of the tests).
const childEnv = "MONGOCAS_TEST_MOVER_CHILD"

const killedAccounts = 10

func killedOptions(outcomes *mongo.Collection) *move.Options {
	return &move.Options{Field: "balance", Grace: 200 * time.Millisecond, Outcomes: outcomes,
		Accept: bson.D{{Key: "closed", Value: bson.D{{Key: "$ne", Value: true}}}}}
}

// TestMovesOfAKilledProcessSettle runs a second OS process (this test
// binary) that moves value among 10 accounts, with Move and MoveAll, and
// relays moves in its own queue worker, beside this process doing the
// same; the sum is sampled every 100 ms. The child is killed with SIGKILL
// mid-run. Then this process's relay and Sweep settle everything the child
// left: no move state remains, the sum never changed, no balance is below
// zero, and each balance is its start plus exactly the moves whose
// recorded outcome is done (the outcomes collection records every move,
// the child's included, even those it never reported).
func TestMovesOfAKilledProcessSettle(t *testing.T) {
	b := setup(t)
	ids := make([]any, 0, killedAccounts+1)
	for i := range killedAccounts {
		b.insert(t, fmt.Sprintf("acct-%02d", i), 1000)
		ids = append(ids, fmt.Sprintf("acct-%02d", i))
	}
	require.NoError(t, b.accounts.Insert(b.ctx, &account{ID: "shut", Closed: true}))
	ids = append(ids, "shut")
	const total = killedAccounts * 1000

	cmd := exec.CommandContext(b.ctx, os.Args[0], "-test.run=^$") //nolint:gosec // this test binary
	cmd.Env = append(os.Environ(), childEnv+"="+b.db.Server.URI+" "+b.db.Name())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()

	jobs := b.queue(t, nil) // never run: its Counts say what the relays have left to do
	obs := b.mover(t, jobs, nil, killedOptions(b.db.Collection("accounts_moves")))
	procs := b.processes(t, 1, func() *move.Options { return killedOptions(b.db.Collection("accounts_moves")) })

	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	var wg sync.WaitGroup
	samples, unstable := sample(ctx, t, &wg, obs, ids, total)
	var made atomic.Int64
	for g := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1)) //nolint:gosec // a small loop index
			for ctx.Err() == nil {
				if moveOnce(procs[0].m, rng) {
					made.Add(1)
				}
			}
		})
	}

	// The child says "moved" after each call that landed. Once it made 60,
	// kill it at an instant its queue worker holds a relay job.
	moved := 0
	deadline := time.After(3 * time.Minute)
	childRunning := func() int64 {
		n, err := b.db.Collection("jobs").CountDocuments(b.ctx, bson.D{{Key: "state", Value: deferred.StateRunning}, {Key: "owner", Value: "child"}})
		require.NoError(t, err)
		return n
	}
	for moved < 60 || childRunning() == 0 {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the child ended before it was killed (it moved %d)", moved)
			if strings.HasPrefix(l, "moved") {
				moved++
			}
		case <-deadline:
			t.Fatalf("the child moved %d times in 3 minutes, or never held a job", moved)
		default:
			time.Sleep(time.Millisecond)
		}
	}
	require.NoError(t, cmd.Process.Kill()) // SIGKILL: no deferred clean-up, no goodbye
	waitErr := cmd.Wait()
	require.Error(t, waitErr, "the child exited by itself")
	left, err := move.Unsettled(b.ctx, b.db.Collection("accounts"), "", 0)
	require.NoError(t, err)
	t.Logf("child killed after %d moves reported (%v): %d move records in flight, %d jobs it was running", moved, waitErr, len(left), childRunning())
	time.Sleep(2 * time.Second) // this process goes on moving past the kill
	cancel()
	wg.Wait()
	b.settleAll(t, obs, jobs)

	// Reconcile: every move, whoever made it, has its outcome recorded.
	want := map[string]int64{"shut": 0}
	for i := range killedAccounts {
		want[fmt.Sprintf("acct-%02d", i)] = 1000
	}
	cur, err := b.db.Collection("accounts_moves").Find(b.ctx, bson.D{{Key: "saga", Value: bson.D{{Key: "$exists", Value: false}}}})
	require.NoError(t, err)
	var recs []struct {
		Outcome  string `bson:"outcome"`
		From, To string
		V        int64
	}
	require.NoError(t, cur.All(b.ctx, &recs))
	var done, returned int
	for _, r := range recs {
		require.Positive(t, r.V)
		switch move.Status(r.Outcome) {
		case move.Done:
			done++
			want[r.From] -= r.V
			want[r.To] += r.V
		case move.Returned:
			returned++
		default:
			t.Fatalf("outcome %q", r.Outcome)
		}
	}
	for id, bal := range want {
		got := b.balance(t, id)
		require.Equal(t, bal, got, "balance of %s", id)
		require.GreaterOrEqual(t, got, int64(0), id)
	}
	s, err := obs.Sum(b.ctx, ids...)
	require.NoError(t, err)
	require.Equal(t, int64(total), s.Sum)
	require.Positive(t, samples.Load())
	require.Positive(t, made.Load())
	t.Logf("%d moves recorded (%d done, %d returned); this process made %d; %d samples, %d unstable",
		len(recs), done, returned, made.Load(), samples.Load(), unstable.Load())
}

// moveOnce makes one random Move among the accounts (now and then to a
// refusing or a missing target), or a MoveAll of two steps, and says
// whether it returned no error.
func moveOnce(m *move.Mover, rng *rand.Rand) bool {
	acct := func() string { return fmt.Sprintf("acct-%02d", rng.IntN(killedAccounts)) }
	from, to := acct(), acct()
	switch rng.IntN(10) {
	case 0:
		to = "ghost"
	case 1:
		to = "shut"
	}
	if from == to {
		return false
	}
	v := int64(1 + rng.IntN(200))
	if rng.IntN(4) == 0 {
		_, err := m.MoveAll(context.Background(), []move.Step{
			{From: from, To: to, Amount: v}, {From: acct(), To: to, Amount: v},
		})
		return err == nil
	}
	_, err := m.Move(context.Background(), from, to, v, nil)
	return err == nil
}

// moverChild is the child process of TestMovesOfAKilledProcessSettle: it
// moves among the accounts of the database named in childEnv, from four
// goroutines, with its own queue worker relaying, and prints "moved" after
// each call that returned no error, until it is killed (or after two
// minutes, so that an orphan ends).
func moverChild(spec string) int {
	uri, name, ok := strings.Cut(spec, " ")
	if !ok {
		fmt.Fprintln(os.Stderr, "child: bad", childEnv)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := store.Connect(ctx, uri, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	db := s.Database(name)
	q, err := deferred.New(db.Collection("jobs"), &deferred.Options{
		Owner: "child", PollInterval: 50 * time.Millisecond, HoleTimeout: 500 * time.Millisecond,
		VisibilityTimeout: 3 * time.Second, MaxAttempts: 1000,
		Backoff: retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	m, err := move.New(ctx, q, db.Collection("accounts"), killedOptions(db.Collection("accounts_moves")))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	go func() { _ = q.Run(ctx) }()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 2)) //nolint:gosec // a small loop index
			for ctx.Err() == nil {
				if moveOnce(m, rng) {
					mu.Lock()
					fmt.Println("moved")
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return 0
}

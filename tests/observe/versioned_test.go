package observe_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

type account struct {
	ID      string `bson:"_id"`
	Balance int64  `bson:"balance"`
	Version int64  `bson:"version"`
}

// repoFixture is a repository that reports to rec, and a second repository
// on the same collection with no Observer, to write behind its back.
type repoFixture struct {
	db    *mongotest.DB
	rec   *recorder
	repo  *versioned.Repo[account]
	other *versioned.Repo[account]
}

func newRepo(t *testing.T) *repoFixture {
	t.Helper()
	db := mongotest.New(t)
	f := &repoFixture{db: db, rec: &recorder{}}
	var err error
	f.repo, err = versioned.New[account](db.Collection("accounts"), &versioned.Options{Observer: f.rec})
	require.NoError(t, err)
	f.other, err = versioned.New[account](db.Collection("accounts"), nil)
	require.NoError(t, err)
	return f
}

func (f *repoFixture) lines(t *testing.T) []string {
	t.Helper()
	return f.rec.lines(t, f.db.Name(), "accounts")
}

// current is the Current of the Conflict event of a Modify's first
// conflict on a document: its write, an updateOne, does not return the
// document (the next attempt reads it), so the version is not known: -1.
// (A document that conflicted lately is written, where the server runs
// update pipelines, by a findOneAndUpdate that returns it.)
const current = -1

// TestModifyConflict: a write lands between Modify's read and its write.
// Modify reports the conflict (see current), one retry caused by it in its own context, and
// two attempts.
func TestModifyConflict(t *testing.T) {
	f := newRepo(t)
	ctx := t.Context()
	a := &account{ID: "a", Balance: 10}
	require.NoError(t, f.repo.Insert(ctx, a))
	v := a.Version
	f.rec.reset()

	calls := 0
	got, err := f.repo.Modify(ctx, "a", func(x *account) error {
		calls++
		if calls == 1 {
			_, err := f.other.Guarded(ctx, "a", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
			require.NoError(t, err)
		}
		x.Balance *= 2
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(22), got.Balance)
	requireLines(t, []string{
		"op.start modify id=a",
		fmt.Sprintf("conflict modify expected=%d current=%d", v, current),
		"retry in=modify attempt=1 cause=conflict",
		"op.end modify id=a ok attempts=2",
	}, f.lines(t))
	end := f.rec.all()[3]
	require.Positive(t, end.Elapsed)
	require.NoError(t, end.Err)
}

// TestCombinedModifyEvents: Modify calls on one document wait in line
// behind a call whose fn blocks, and are combined into fewer writes; each
// call still reports its own start and its own end, in its own context,
// with its own outcome and attempts: one call's fn returns an error
// (aborted), one changes nothing, the others increment. No other process
// writes, so no call meets a conflict, whichever calls share a write.
func TestCombinedModifyEvents(t *testing.T) {
	f := newRepo(t)
	ctx := t.Context()
	require.NoError(t, f.repo.Insert(ctx, &account{ID: "a", Balance: 10}))
	const calls = 6
	gate := make(chan struct{})
	byCall := &callRecorder{rec: f.rec, onStart: func(n int) {
		if n == calls {
			close(gate)
		}
	}}
	repo, err := versioned.New[account](f.db.Collection("accounts"), &versioned.Options{Observer: byCall})
	require.NoError(t, err)
	f.rec.reset()

	declined := errors.New("declined")
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			_, errs[i] = repo.Modify(context.WithValue(ctx, callKey{}, i), "a", func(x *account) error {
				switch i {
				case 0:
					<-gate // every call has started: the others wait in line
				case 1:
					return declined
				case 2:
					return nil // no change
				}
				x.Balance++
				return nil
			})
		})
	}
	wg.Wait()
	for i := range calls {
		want := []string{"op.start modify id=a", "op.end modify id=a ok attempts=1"}
		switch i {
		case 1:
			require.ErrorIs(t, errs[i], declined)
			want[1] = "op.end modify id=a aborted attempts=1"
		default:
			require.NoError(t, errs[i], "call %d", i)
		}
		requireLines(t, want, byCall.lines(t, i, f.db.Name(), "accounts"))
	}
	got, err := repo.Get(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, int64(10+calls-2), got.Balance)
}

// callKey marks the context of a test's call with its number.
type callKey struct{}

// callRecorder records in rec, and keeps apart the lines of each call (by
// the callKey of the context the event came with).
type callRecorder struct {
	rec     *recorder
	onStart func(starts int)

	mu     sync.Mutex
	starts int
	by     map[int][]string
}

func (c *callRecorder) Start(ctx context.Context, e observe.Event) context.Context {
	ctx = c.rec.Start(ctx, e)
	c.keep(ctx, e)
	c.mu.Lock()
	c.starts++
	n := c.starts
	c.mu.Unlock()
	c.onStart(n)
	return ctx
}

func (c *callRecorder) Observe(ctx context.Context, e observe.Event) {
	c.rec.Observe(ctx, e)
	c.keep(ctx, e)
}

func (c *callRecorder) keep(ctx context.Context, e observe.Event) {
	i, ok := ctx.Value(callKey{}).(int)
	if !ok {
		i = -1
	}
	in, _ := ctx.Value(opKey{}).(string)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[int][]string{}
	}
	c.by[i] = append(c.by[i], line(e, in))
}

// lines returns call i's lines, after checking every event as
// recorder.lines does.
func (c *callRecorder) lines(t *testing.T, i int, db, coll string) []string {
	t.Helper()
	c.rec.lines(t, db, coll)
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.by[i]...)
}

// TestUpdateConflict: a stale copy. The conflict carries both versions, and
// the call ends with the conflict as its outcome (an answer, not a
// failure).
func TestUpdateConflict(t *testing.T) {
	f := newRepo(t)
	ctx := t.Context()
	a := &account{ID: "a", Balance: 10}
	require.NoError(t, f.repo.Insert(ctx, a))
	stale := *a
	a.Balance = 11
	require.NoError(t, f.repo.Update(ctx, a))
	f.rec.reset()

	stale.Balance = 12
	err := f.repo.Update(ctx, &stale)
	require.ErrorIs(t, err, versioned.ErrConflict)
	requireLines(t, []string{
		"op.start update id=a",
		fmt.Sprintf("conflict update expected=%d current=%d", stale.Version, a.Version),
		"op.end update id=a conflict",
	}, f.lines(t))
	require.ErrorIs(t, f.rec.all()[2].Err, versioned.ErrConflict)
}

// TestBudgetRefused: Modify meets a conflict and the retry budget (of a
// WithRetry policy, which gets the repository's Observer) has no token.
func TestBudgetRefused(t *testing.T) {
	f := newRepo(t)
	ctx := t.Context()
	a := &account{ID: "a", Balance: 10}
	require.NoError(t, f.repo.Insert(ctx, a))
	f.rec.reset()

	empty := retry.Policy{Budget: retry.NewBudget(0, 0)}
	_, err := f.repo.Modify(ctx, "a", func(x *account) error {
		_, err := f.other.Guarded(ctx, "a", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
		require.NoError(t, err)
		x.Balance = 0
		return nil
	}, versioned.WithRetry(empty))
	require.ErrorIs(t, err, retry.ErrBudgetExhausted)
	requireLines(t, []string{
		"op.start modify id=a",
		fmt.Sprintf("conflict modify expected=%d current=%d", a.Version, current),
		"retry.budget_refused in=modify attempt=1 cause=conflict",
		"op.end modify id=a budget_exhausted attempts=1",
	}, f.lines(t))
}

// TestAnswers: answers about the data, and the caller's own function's
// error, end the operation with their outcome and nothing between.
func TestAnswers(t *testing.T) {
	f := newRepo(t)
	ctx := t.Context()
	require.NoError(t, f.repo.Insert(ctx, &account{ID: "a", Balance: 1}))
	f.rec.reset()

	_, err := f.repo.Guarded(ctx, "a", bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: 5}}}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -5}}}})
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	_, err = f.repo.Get(ctx, "nobody")
	require.ErrorIs(t, err, versioned.ErrNotFound)
	_, err = f.repo.Get(ctx, "")
	require.ErrorIs(t, err, versioned.ErrInvalid, "refused before anything is sent: no events")
	declined := errors.New("declined")
	_, err = f.repo.Modify(ctx, "a", func(*account) error { return declined })
	require.ErrorIs(t, err, declined)
	requireLines(t, []string{
		"op.start guarded id=a",
		"op.end guarded id=a guard_failed",
		"op.start get id=nobody",
		"op.end get id=nobody not_found",
		"op.start modify id=a",
		"op.end modify id=a aborted attempts=1",
	}, f.lines(t))
	require.False(t, f.rec.all()[5].Outcome.Failed(), "the caller's answer, not the library's failure")
}

// faultyRepo is newRepo's repository on a client whose traffic passes
// through a fault proxy, with retryable writes off.
func faultyRepo(t *testing.T) (*repoFixture, *mongotest.Faulty) {
	t.Helper()
	f := newRepo(t)
	fc := f.db.Faulty(t, nil)
	repo, err := versioned.New[account](fc.Collection("accounts"), &versioned.Options{Observer: f.rec})
	require.NoError(t, err)
	f.repo = repo
	return f, fc
}

// TestAmbiguousUpdate: an update whose reply the client never gets.
// Dropped: the server applied it, and the repository settles it as landed
// by its write id. Late copy: it never reached the server (the proxy keeps
// it); the re-read shows it has not landed and still can, so the
// repository sends it again and that copy lands; the kept copy, delivered
// afterwards, matches nothing.
func TestAmbiguousUpdate(t *testing.T) {
	for _, c := range []struct {
		name    string
		arm     func(*mongotest.Faulty) *mongotest.Fault
		settled string
	}{
		{"dropped reply", func(fc *mongotest.Faulty) *mongotest.Fault { return fc.DropNextReply(mongotest.Writes("accounts")) }, "landed"},
		{"late copy", func(fc *mongotest.Faulty) *mongotest.Fault { return fc.HoldNext(mongotest.Writes("accounts")) }, "resent"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, fc := faultyRepo(t)
			ctx := t.Context()
			a := &account{ID: "a", Balance: 10}
			require.NoError(t, f.repo.Insert(ctx, a))
			f.rec.reset()

			fault := c.arm(fc)
			a.Balance = 20
			require.NoError(t, f.repo.Update(ctx, a))
			require.True(t, fault.HasFired())
			requireLines(t, []string{
				"op.start update id=a",
				"write.ambiguous update cause=network",
				"write.settled update " + c.settled,
				"op.end update id=a ok",
			}, f.lines(t))
			if c.settled == "resent" {
				reply, err := fault.Deliver(ctx)
				require.NoError(t, err)
				require.EqualValues(t, 0, reply.Lookup("n").AsInt64(), "the late copy applies nothing")
			}
		})
	}
}

// TestUnknownOutcome: an insert is kept at the proxy (the client sees a
// network error) and the re-read finds no document: it may still arrive,
// and Insert never sends it again, so the outcome is unknown. The
// operation ends with OutcomeUnknown, which the slog Observer logs as a
// warning.
func TestUnknownOutcome(t *testing.T) {
	f, fc := faultyRepo(t)
	ctx := t.Context()
	f.rec.reset()

	fc.HoldNext(mongotest.Writes("accounts"))
	err := f.repo.Insert(ctx, &account{ID: "u", Balance: 1})
	require.ErrorIs(t, err, versioned.ErrUnknownOutcome)
	requireLines(t, []string{
		"op.start insert id=u",
		"write.ambiguous insert cause=network",
		"write.settled insert unknown",
		"op.end insert id=u unknown_outcome",
	}, f.lines(t))
	events := f.rec.all()
	require.ErrorIs(t, events[2].Err, versioned.ErrUnknownOutcome, "Settled carries why")
	require.Equal(t, observe.OutcomeUnknown, events[3].Outcome)
	require.True(t, events[3].Outcome.Failed())
}

// TestOperationRunsInStartsContext: the context an Observer's Start
// returns is the context of the operation's I/O too (so a span started there
// is the parent of the driver's own spans). Here it has been cancelled, and
// the operation fails on it, and ends with that outcome.
func TestOperationRunsInStartsContext(t *testing.T) {
	db := mongotest.New(t)
	rec := &recorder{}
	repo, err := versioned.New[account](db.Collection("accounts"), &versioned.Options{Observer: observe.Join(cancelling{}, rec)})
	require.NoError(t, err)
	_, err = repo.Get(t.Context(), "a")
	require.ErrorIs(t, err, context.Canceled)
	requireLines(t, []string{
		"op.start get id=a",
		"op.end get id=a canceled",
	}, rec.lines(t, db.Name(), "accounts"))
}

// cancelling is an Observer whose Start returns a cancelled context.
type cancelling struct{}

func (cancelling) Start(ctx context.Context, _ observe.Event) context.Context {
	c, cancel := context.WithCancel(ctx)
	cancel()
	return c
}
func (cancelling) Observe(context.Context, observe.Event) {}

// TestSlogQuietAtInfo: at Info, normal operation logs nothing (a conflict
// retried, a missing document, a failed guard), and an unknown outcome is
// one warning.
func TestSlogQuietAtInfo(t *testing.T) {
	db := mongotest.New(t)
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil)) // Info
	fc := db.Faulty(t, nil)
	repo, err := versioned.New[account](fc.Collection("accounts"), &versioned.Options{Observer: observe.Slog(logger)})
	require.NoError(t, err)
	other, err := versioned.New[account](db.Collection("accounts"), nil)
	require.NoError(t, err)
	ctx := t.Context()

	require.NoError(t, repo.Insert(ctx, &account{ID: "a", Balance: 1}))
	calls := 0
	_, err = repo.Modify(ctx, "a", func(x *account) error {
		if calls++; calls == 1 {
			_, err := other.Guarded(ctx, "a", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
			require.NoError(t, err)
		}
		x.Balance++
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 2, calls, "a conflict was retried")
	_, err = repo.Get(ctx, "nobody")
	require.ErrorIs(t, err, versioned.ErrNotFound)
	_, err = repo.Guarded(ctx, "a", bson.D{{Key: "balance", Value: bson.D{{Key: "$gt", Value: 100}}}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 1}}}})
	require.ErrorIs(t, err, versioned.ErrGuardFailed)
	require.Empty(t, buf.String(), "normal operation is quiet at Info")

	fc.HoldNext(mongotest.Writes("accounts"))
	require.ErrorIs(t, repo.Insert(ctx, &account{ID: "u"}), versioned.ErrUnknownOutcome)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2, buf.String())
	require.Contains(t, lines[0], `level=INFO msg="mongocas write.settled" op=insert`)
	require.Contains(t, lines[0], "settlement=unknown")
	require.Contains(t, lines[1], `level=WARN msg="mongocas op.end" op=insert`)
	require.Contains(t, lines[1], "outcome=unknown_outcome")
}

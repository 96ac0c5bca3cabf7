package versioned_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// TestConflictCostsOneRoundTrip: a Modify whose write meets a conflict (the
// document changed after it read it) retries. An uncontended write is an
// updateOne, which says nothing of the document on a conflict: the first
// conflict is retried at once from a read. From then on, for a while (the
// document is hot), where the server runs update pipelines (DocumentDB,
// MongoDB), the write is a findOneAndUpdate that returns the current
// document when it does not apply, so a conflict's retry sends no read:
// one find and two findAndModify in all. Elsewhere (the embedded FerretDB
// v1) every conflict reads again. Either way the result is exact.
func TestConflictCostsOneRoundTrip(t *testing.T) {
	t.Parallel()
	f := newConflictFixture(t)
	b, repo, doc, counter, base := f.b, f.repo, f.doc, f.counter, f.base
	pipes := b.db.Server.Caps.UpdatePipelines

	got, calls, delays := f.modifyMeeting(t, 1)
	require.Equal(t, 2, calls)
	require.Equal(t, int64((11+100)*2), got.Balance)
	require.Equal(t, doc.Version+3, got.Version)
	sent := counter.since(base)
	if pipes {
		require.Equal(t, map[string]int{"find": 2, "update": 1, "findAndModify": 1}, sent, "read, write, read again at once, write in the pipeline form")
		require.Equal(t, []time.Duration{0}, delays, "the first conflict is retried at once")
	} else {
		require.Equal(t, map[string]int{"find": 2, "update": 2}, sent, "without update pipelines: read, write, read again, write")
	}

	base = counter.snapshot()
	got, calls, _ = f.modifyMeeting(t, 1)
	require.Equal(t, 2, calls)
	require.Equal(t, int64(((11+100)*2+100)*2), got.Balance)
	require.Equal(t, doc.Version+5, got.Version)
	sent = counter.since(base)
	if pipes {
		require.Equal(t, map[string]int{"find": 1, "findAndModify": 2}, sent, "the conflict returned the document: no second read")
	} else {
		require.Equal(t, map[string]int{"find": 2, "update": 2}, sent, "without update pipelines: read, write, read again, write")
	}
	stored, err := repo.Get(b.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, got.Balance, stored.Balance)
}

// TestSecondConflictReadsAgain: only a Modify's first conflict is retried
// from the document its write returned, at once. The retry after a second
// conflict waits out its backoff and reads again: a document kept through
// a backoff is stale whenever another process keeps writing, and attempts
// made from it would lose again and again.
func TestSecondConflictReadsAgain(t *testing.T) {
	t.Parallel()
	f := newConflictFixture(t)
	b, doc, counter, base := f.b, f.doc, f.counter, f.base

	got, calls, delays := f.modifyMeeting(t, 2)
	require.Equal(t, 3, calls)
	require.Len(t, delays, 2)
	require.Positive(t, delays[1], "the second retry waits its backoff")
	require.Equal(t, int64((11+200)*2), got.Balance)
	require.Equal(t, doc.Version+4, got.Version)
	sent := counter.since(base)
	if b.db.Server.Caps.UpdatePipelines {
		require.Equal(t, map[string]int{"find": 3, "update": 1, "findAndModify": 2}, sent, "read, write, read again at once, write (pipeline form), read again, write")
		require.Zero(t, delays[0], "the first retry comes at once")
	} else {
		require.Equal(t, map[string]int{"find": 3, "update": 3}, sent, "without update pipelines: a read before each write")
		require.Positive(t, delays[0], "without a returned document, every retry waits its backoff")
	}
}

// modifyMeeting runs a Modify of "a" that doubles the balance, and whose
// first n attempts each meet a write of another process (+100) between
// their read (or returned document) and their write; it returns the
// document, how many times fn ran and the delays of the retries.
func (f *conflictFixture) modifyMeeting(t *testing.T, n int) (*account, int, []time.Duration) {
	t.Helper()
	calls := 0
	var delays []time.Duration
	record := versioned.WithRetry(retry.Policy{OnRetry: func(a retry.Attempt) { delays = append(delays, a.Delay) }})
	got, err := f.repo.Modify(f.b.ctx, "a", func(a *account) error {
		if calls++; calls <= n {
			_, err := f.other.Guarded(f.b.ctx, "a", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 100}}}})
			require.NoError(t, err)
		}
		a.Balance *= 2
		return nil
	}, record)
	require.NoError(t, err)
	return got, calls, delays
}

// conflictFixture is a document "a" (balance 11, after one Modify) that
// repo, through a client whose commands counter counts, and other, through
// a client of its own (another process), both write. base is counter's
// state after that first Modify, which taught repo whether the server runs
// update pipelines.
type conflictFixture struct {
	b           *bundle
	repo, other *versioned.Repo[account]
	doc         *account // as inserted
	counter     *commandCounter
	base        map[string]int
}

func newConflictFixture(t *testing.T) conflictFixture {
	t.Helper()
	_, b := setup[account](t, nil)
	f := conflictFixture{b: b, counter: &commandCounter{n: map[string]int{}}, doc: &account{ID: "a", Balance: 10}}
	var err error
	f.repo, err = versioned.New[account](client(t, b, f.counter), nil)
	require.NoError(t, err)
	f.other, err = versioned.New[account](client(t, b, nil), nil)
	require.NoError(t, err)
	require.NoError(t, f.other.Insert(b.ctx, f.doc))
	_, err = f.repo.Modify(b.ctx, "a", func(a *account) error { a.Balance++; return nil })
	require.NoError(t, err)
	f.base = f.counter.snapshot()
	return f
}

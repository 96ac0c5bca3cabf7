package versioned_test

// Write ids stay bounded: a document keeps the ids of its last
// versioned.WriteIDs writes and no more, whoever writes it and whatever
// each writer saw.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

// TestWriteIDsStayBounded: every kind of write, by two repositories, keeps
// the document at no more than WriteIDs write ids, the last ones written.
func TestWriteIDsStayBounded(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	requireSlice(t, b)
	// Another repository on the same collection stands for another process.
	other, err := versioned.New[account](b.coll, nil)
	require.NoError(t, err)
	a := &account{ID: "a1"}
	require.NoError(t, repo.Insert(b.ctx, a))
	const writes = 3 * versioned.WriteIDs
	for i := range writes {
		r := repo
		if i%2 == 1 {
			r = other
		}
		switch i % 3 {
		case 0:
			held, err := r.Get(b.ctx, "a1")
			require.NoError(t, err)
			held.Balance++
			require.NoError(t, r.Update(b.ctx, held))
		case 1:
			_, err := r.Modify(b.ctx, "a1", func(x *account) error { x.Balance++; return nil })
			require.NoError(t, err)
		case 2:
			_, err := r.Guarded(b.ctx, "a1", nil, bson.M{"$inc": bson.M{"balance": 1}})
			require.NoError(t, err)
		}
		require.Len(t, b.writeIDs(t, "a1"), min(i+2, versioned.WriteIDs), "write %d", i)
	}
	m := b.raw(t, "a1")
	require.Equal(t, a.Version+writes, m["version"])
	require.Equal(t, int64(writes), m["balance"])
	mc, ok := m["_mc"].(bson.M)
	require.True(t, ok)
	require.Len(t, mc, 2, "the metadata is the incarnation and the write ids, nothing else: %v", mc)
}

// TestFootprintAfterMixedWritesIsAtMost256Bytes: 8 writers, each through a
// client of its own (another process to the server and to the library),
// make 1,000 writes of every kind to one document (Modify, a Get and an
// Update of the copy, Guarded): the version and the metadata then take at
// most 256 bytes, on every server (FerretDB v1 ignores $slice: there the
// writes that pin a version cut the list).
func TestFootprintAfterMixedWritesIsAtMost256Bytes(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	require.NoError(t, repo.Insert(b.ctx, &account{ID: "f", Owner: "ana"}))
	const writers, each = 8, 125
	var (
		done atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, writers)
	)
	// Eight writers on one document conflict often, and a loaded machine
	// makes each round slow: the default 10 s of retrying ran out (5
	// attempts in 11.8 s at load 16). The bound on time is not what this
	// test is about.
	patient := &versioned.Options{Retry: retry.Policy{MaxElapsedTime: 2 * time.Minute}}
	for w := range writers {
		r, err := versioned.New[account](client(t, b, nil), patient)
		require.NoError(t, err)
		wg.Go(func() {
			for i := range each {
				switch (w + i) % 3 {
				case 0:
					_, err = r.Modify(b.ctx, "f", func(a *account) error { a.Balance++; return nil })
				case 1:
					for err = versioned.ErrConflict; errors.Is(err, versioned.ErrConflict); {
						var held *account
						if held, err = r.Get(b.ctx, "f"); err == nil {
							held.Balance++
							err = r.Update(b.ctx, held)
						}
					}
				case 2:
					_, err = r.Guarded(b.ctx, "f", nil, bson.M{"$inc": bson.M{"balance": 1}})
				}
				if err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(writers*each), done.Load())
	raw := b.rawBytes(t, "f")
	elems, err := raw.Elements()
	require.NoError(t, err)
	size := 0
	for _, e := range elems {
		if k := e.Key(); k == "version" || k == "_mc" {
			size += len(e)
		}
	}
	t.Logf("after %d writes by %d writers: version and _mc take %d bytes, %d write ids; the document %d bytes", writers*each, writers, size, len(b.writeIDs(t, "f")), len(raw))
	require.Equal(t, int64(writers*each), b.raw(t, "f")["balance"], "every write applied once")
	require.LessOrEqual(t, size, 256, "the write-id protocol's fields outgrew their bound")
}

// TestThousandWritersKeepAtMostWriteIDs: 1,000 distinct repositories (short
// lived processes, serverless calls), one write each, of every kind: the
// document never holds more than WriteIDs write ids, whatever any writer
// saw, since the bound is part of each write's own update on the server.
func TestThousandWritersKeepAtMostWriteIDs(t *testing.T) {
	t.Parallel()
	repo, b := setup[account](t, nil)
	requireSlice(t, b)
	k := &account{ID: "k"}
	require.NoError(t, repo.Insert(b.ctx, k))
	const writers = 1000
	for i := range writers {
		r, err := versioned.New[account](b.coll, nil)
		require.NoError(t, err)
		switch i % 3 {
		case 0: // a copy read by another process: no read by this one
			require.NoError(t, r.Update(b.ctx, &account{ID: "k", Balance: int64(i + 1), Version: k.Version + int64(i)}))
		case 1:
			_, err = r.Modify(b.ctx, "k", func(a *account) error { a.Balance++; return nil })
			require.NoError(t, err)
		case 2:
			_, err = r.Guarded(b.ctx, "k", nil, bson.M{"$inc": bson.M{"balance": 1}})
			require.NoError(t, err)
		}
		if i%97 == 0 {
			require.LessOrEqual(t, len(b.writeIDs(t, "k")), versioned.WriteIDs, "after write %d", i)
		}
	}
	require.Len(t, b.writeIDs(t, "k"), versioned.WriteIDs)
	require.Equal(t, k.Version+writers, b.raw(t, "k")["version"])
}

// TestShortLivedWritersKeepAtMostWriteIDs: processes that write a document
// once and then go away (restarts, deploys, serverless functions, cron jobs,
// CLIs), or a form flow whose Get and Update land on different instances,
// each Update without reading: their ids do not accumulate (each would add
// ~40 bytes, until the document hit 16 MiB and every write to it failed).
func TestShortLivedWritersKeepAtMostWriteIDs(t *testing.T) {
	repo, b := setup[account](t, nil)
	requireSlice(t, b)
	ctx := context.Background()
	g := &account{ID: "g", Balance: 0}
	require.NoError(t, repo.Insert(ctx, g))

	const writers = 100 // 100 short-lived processes, one Update each
	for i := range writers {
		r, err := versioned.New[account](b.coll, nil)
		require.NoError(t, err)
		require.NoError(t, r.Update(ctx, &account{ID: "g", Balance: int64(i + 1), Version: g.Version + int64(i)}))
	}
	n := len(b.writeIDs(t, "g"))
	t.Logf("after %d writes the document carries %d write ids (bound %d), %d bytes", writers, n, versioned.WriteIDs, len(b.rawBytes(t, "g")))
	require.LessOrEqual(t, n, versioned.WriteIDs, "BUG: write ids linger beyond the WriteIDs bound")
}

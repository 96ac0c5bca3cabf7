package versioned_test

// Repro: write ids accumulate without bound.
//
// The doc says "with several repositories (processes) writing it, ids of the
// others' writes linger for up to History versions". But a repository prunes
// only ids it has *read* (docCache.observe) or written itself, and Update
// does not read. Processes that write a document once and then go away
// (restarts, deploys, serverless functions, cron jobs, CLIs), or a form flow
// whose Get and Update land on different instances, leave their ids for
// good: each Update adds ~40 bytes that nobody removes, until the document
// hits 16 MiB and every write to it fails.

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/versioned"
)

func TestReproWriteIDsGrowWithoutBound(t *testing.T) {
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
	require.LessOrEqual(t, n, versioned.WriteIDs, "BUG: write ids linger far beyond History versions")
}

package versioned_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
)

// TestAmbiguousWriteIsSettledByMajorityRead: after a lost reply, the
// re-read that settles the write asks for read concern majority (a local
// read on a primary about to be rolled back could see a write that is then
// undone), and the backend answers it. Ordinary reads keep the collection's
// read concern.
func TestAmbiguousWriteIsSettledByMajorityRead(t *testing.T) {
	repo, f, b := setupFaulty[account](t, nil)
	a := &account{ID: "m", Balance: 1}
	require.NoError(t, repo.Insert(b.ctx, a))
	v0 := a.Version

	var (
		mu     sync.Mutex
		levels []string // the read concern level of each find, "" for none
	)
	// A fault that never acts, to watch the finds.
	f.DropNextReply(func(c *mongotest.Command) bool {
		if c.Name == "find" && c.Collection == b.coll.Name() {
			level, _ := c.Body.Lookup("readConcern", "level").StringValueOK()
			mu.Lock()
			levels = append(levels, level)
			mu.Unlock()
		}
		return false
	})
	got, err := repo.Get(b.ctx, "m")
	require.NoError(t, err)
	fault := dropNextWrite(f, b)
	got.Balance = 2
	require.NoError(t, repo.Update(b.ctx, got), "the write landed and the majority re-read shows it")
	requireDropped(t, fault)
	require.Equal(t, v0+1, got.Version)
	require.Equal(t, int64(2), b.raw(t, "m")["balance"])

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"", "majority"}, levels, "the Get reads as the collection does; the settling re-read reads majority")
}

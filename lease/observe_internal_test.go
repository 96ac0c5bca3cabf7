package lease

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/observe"
)

// TestObserveAllocations pins the cost of the event surface on the
// Manager's side, exactly (the benchmarks against a server count the
// driver's allocations too): with no Observer, no reporting point
// allocates; with the slog Observer at Info, a claim, a renewal and a
// release that go well allocate nothing either.
func TestObserveAllocations(t *testing.T) {
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1")) // no I/O here
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	coll := client.Database("d").Collection("c")
	ctx := context.Background()

	for _, c := range []struct {
		name string
		obs  observe.Observer
	}{
		{"none", nil},
		// A handler at Info, so that its level check is what runs.
		{"slog-info", observe.Slog(slog.New(slog.NewTextHandler(io.Discard, nil)))}, //nolint:sloglint // see above
	} {
		m, err := New(coll, &Options{TTL: time.Minute, Owner: "a", Observer: c.obs})
		require.NoError(t, err)
		l := &Lease{m: m, id: "a", epoch: 7, ctx: ctx, deadline: time.Now().Add(time.Hour)}
		allocs := testing.AllocsPerRun(100, func() {
			var err error
			cx, ob := m.begin(ctx, opTryAcquire, "a")
			m.acquired(cx, opTryAcquire, l, ob.start)
			m.end(&ob, &err)
			_, ob = m.begin(ctx, opRenew, "a")
			l.endRenew(&ob, &err)
			_, ob = m.begin(ctx, opRelease, "a")
			l.ended(ErrReleased)
			m.end(&ob, &err)
		})
		require.Zero(t, allocs, c.name)
	}

	m, err := New(coll, &Options{TTL: time.Minute, Owner: "a"})
	require.NoError(t, err)
	l := &Lease{m: m, id: "a", epoch: 7, ctx: ctx}
	lost := error(&LostError{ID: "a", Reason: TakenOver})
	require.Zero(t, testing.AllocsPerRun(100, func() {
		m.heldBy(ctx, "a", record{Owner: "b"}, time.Second)
		_ = m.settling(ctx, opAcquire, "a")
		l.ended(lost)
	}), "no Observer: the rarer events build nothing either")
}

package versioned

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/observe"
)

type observedDoc struct {
	ID      string `bson:"_id"`
	Version int64  `bson:"version"`
}

// TestObserveAllocations pins the cost of the event surface on the
// repository's side, exactly (the benchmarks against a server count the
// driver's allocations too, and the embedded server's): with no Observer,
// no reporting point allocates; with the slog Observer at Info, an
// operation that goes well allocates nothing either.
func TestObserveAllocations(t *testing.T) {
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1")) // no I/O here
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	coll := client.Database("d").Collection("c")
	ctx := context.Background()

	none, err := New[observedDoc](coll, nil)
	require.NoError(t, err)
	w := &write{op: "update", id: "a"}
	conflict := error(&ConflictError{Op: "update", ID: "a", Expected: 1, Current: 2})
	require.Zero(t, testing.AllocsPerRun(100, func() {
		var err error
		c, ob := none.begin(ctx, "update", "a")
		_ = none.conflicted(c, conflict)
		none.settling(c, w, observe.Ambiguous, 0, conflict)
		none.settling(c, w, observe.Settled, observe.SettledLanded, nil)
		_ = none.policy(nil)
		ob.attempts++
		none.end(&ob, &err)
	}), "no Observer: nothing is built")

	// A handler at Info, so that its level check is what runs.
	info := observe.Slog(slog.New(slog.NewTextHandler(io.Discard, nil))) //nolint:sloglint // see above
	logged, err := New[observedDoc](coll, &Options{Observer: info})
	require.NoError(t, err)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		var err error
		_, ob := logged.begin(ctx, "update", "a")
		ob.attempts++
		logged.end(&ob, &err)
	}), "slog at Info: an operation that goes well logs nothing and allocates nothing")
}

package observe_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

type Account struct {
	ID      string `bson:"_id"`
	Balance int64  `bson:"balance"`
	Version int64  `bson:"version"`
}

// One Observer on a repository logs (quiet at Info while all goes well) and
// counts what it does. The example needs a server: it connects to
// MONGODB_URI and returns when it is not set.
func ExampleJoin() {
	uri := os.Getenv("MONGODB_URI")
	if uri == "" {
		return
	}
	ctx := context.Background()
	s, err := store.Connect(ctx, uri, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close(ctx)

	var counts observe.Counters // share one across repositories and managers
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	accounts, err := versioned.New[Account](s.Database("example").Collection("accounts"), &versioned.Options{
		Observer: observe.Join(observe.Slog(logger), &counts),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	_, _ = accounts.Modify(ctx, "ana", func(a *Account) error { a.Balance++; return nil })
	fmt.Println(counts.Count(observe.OpEnd), "operations,", counts.Count(observe.Conflict), "conflicts")
}

// Counters counts events without a server too: here, the events a test
// hands it.
func ExampleCounters() {
	var counts observe.Counters
	ctx := context.Background()
	counts.Observe(ctx, observe.Event{Kind: observe.OpStart, Op: "modify"})
	counts.Observe(ctx, observe.Event{Kind: observe.Conflict, Op: "modify"})
	counts.Observe(ctx, observe.Event{Kind: observe.OpEnd, Op: "modify", Outcome: observe.OK})
	fmt.Println(counts.Count(observe.OpEnd), counts.Count(observe.Conflict), counts.Failed())
	// Output: 1 1 0
}

package lease_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

// exampleDB returns a fresh database on mongotest's server and a function
// that drops it. Real code uses its own *mongo.Database.
func exampleDB() (*mongo.Database, func()) {
	ctx := context.Background()
	srv, err := mongotest.Start(ctx)
	if err != nil {
		panic(err)
	}
	db := srv.Client.Database("example_lease_" + bson.NewObjectID().Hex())
	return db, func() { _ = db.Drop(ctx) }
}

// A second worker is refused while the first holds the lease, and told for
// how long: enough for an HTTP 409 with Retry-After (here in minutes).
func ExampleManager_TryAcquire() {
	db, drop := exampleDB()
	defer drop()
	ctx := context.Background()
	users := db.Collection("users")
	if _, err := users.InsertOne(ctx, bson.D{{Key: "_id", Value: "user-42"}, {Key: "name", Value: "Ada"}}); err != nil {
		panic(err)
	}

	worker1, err := lease.New(users, &lease.Options{TTL: 2 * time.Minute, Owner: "worker-1"})
	if err != nil {
		panic(err)
	}
	worker2, err := lease.New(users, &lease.Options{TTL: 2 * time.Minute, Owner: "worker-2"})
	if err != nil {
		panic(err)
	}

	l, err := worker1.TryAcquire(ctx, "user-42")
	if err != nil {
		panic(err)
	}
	first := l.Epoch() // the server's time in µs when the document was first leased
	fmt.Println("worker-1 holds the lease")

	_, err = worker2.TryAcquire(ctx, "user-42")
	if held, ok := errors.AsType[*lease.HeldError](err); ok {
		fmt.Printf("worker-2: 409, held by %s, Retry-After %v\n", held.Owner, held.TimeLeft.Round(time.Minute))
	}

	if err := l.Release(ctx); err != nil {
		panic(err)
	}
	l, err = worker2.TryAcquire(ctx, "user-42")
	if err != nil {
		panic(err)
	}
	fmt.Println("worker-2 holds the lease, epoch +", l.Epoch()-first)
	_ = l.Release(ctx)
	// Output:
	// worker-1 holds the lease
	// worker-2: 409, held by worker-1, Retry-After 2m0s
	// worker-2 holds the lease, epoch + 1
}

// Do runs a function under the lease: it renews in the background, cancels
// the function's context if the lease is lost, and releases at the end. The
// write inside is fenced on the lease.
func ExampleManager_Do() {
	db, drop := exampleDB()
	defer drop()
	ctx := context.Background()
	users := db.Collection("users")
	if _, err := users.InsertOne(ctx, bson.D{{Key: "_id", Value: "user-42"}, {Key: "primary", Value: "identity-a"}}); err != nil {
		panic(err)
	}
	m, err := lease.New(users, &lease.Options{TTL: 10 * time.Second})
	if err != nil {
		panic(err)
	}

	err = m.Do(ctx, "user-42", func(ctx context.Context, l *lease.Lease) error {
		// The slow external calls go here, stopping when ctx ends:
		// partner.Unlink(ctx, ...); partner.Link(ctx, ...)
		filter := append(bson.D{{Key: "_id", Value: "user-42"}}, l.Fence()...)
		res, err := users.UpdateOne(ctx, filter, bson.D{{Key: "$set", Value: bson.D{{Key: "primary", Value: "identity-b"}}}})
		if err != nil {
			return err
		}
		fmt.Println("fenced write matched", res.MatchedCount)
		return nil
	})
	fmt.Println("Do:", err)
	// Output:
	// fenced write matched 1
	// Do: <nil>
}

// A named lease guards a resource that is not a document: a lock document
// named after it is created by the first claim.
func ExampleNewNamed() {
	db, drop := exampleDB()
	defer drop()
	ctx := context.Background()
	m, err := lease.NewNamed(db.Collection("locks"), &lease.Options{TTL: 10 * time.Second, Owner: "api-1"})
	if err != nil {
		panic(err)
	}
	// A TTL index cleans up stale lock documents where the server has TTL
	// indexes; elsewhere call m.Sweep from time to time.
	if _, err := m.EnsureIndexes(ctx); err != nil {
		panic(err)
	}
	var last int64
	for range 2 {
		err = m.Do(ctx, "partner-api:user:42", func(ctx context.Context, l *lease.Lease) error {
			// The fencing token: pass it to the API if it accepts one.
			fmt.Println("calling the partner API as", l.Owner(), "with a larger fencing token:", l.Epoch() > last)
			last = l.Epoch()
			return nil
		})
		if err != nil {
			panic(err)
		}
	}
	// Output:
	// calling the partner API as api-1 with a larger fencing token: true
	// calling the partner API as api-1 with a larger fencing token: true
}

// Fence fences a versioned write on the lease, with versioned.WhereErr:
// once the lease is lost, the write changes nothing and reports ErrLost.
func ExampleLease_Fence_versioned() {
	db, drop := exampleDB()
	defer drop()
	ctx := context.Background()
	type Account struct {
		ID      string `bson:"_id"`
		Partner string `bson:"partner"`
		Version int64  `bson:"version"`
	}
	accounts, err := versioned.New[Account](db.Collection("accounts"), nil)
	if err != nil {
		panic(err)
	}
	acct := &Account{ID: "acct-7"}
	if err := accounts.Insert(ctx, acct); err != nil {
		panic(err)
	}
	m, err := lease.New(db.Collection("accounts"), &lease.Options{TTL: 10 * time.Second})
	if err != nil {
		panic(err)
	}
	l, err := m.TryAcquire(ctx, "acct-7")
	if err != nil {
		panic(err)
	}
	acct.Partner = "linked"
	fmt.Println("while held:", accounts.Update(ctx, acct, versioned.WhereErr(l.Fence(), lease.ErrLost)))
	if err := l.Release(ctx); err != nil {
		panic(err)
	}
	acct.Partner = "linked again"
	err = accounts.Update(ctx, acct, versioned.WhereErr(l.Fence(), lease.ErrLost))
	fmt.Println("after release, lost:", errors.Is(err, lease.ErrLost))
	// Output:
	// while held: <nil>
	// after release, lost: true
}

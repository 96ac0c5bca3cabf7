package versioned_test

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/versioned"
)

// Wallet is the model of the examples: the id and the version are found by
// their bson tags.
type Wallet struct {
	ID      string `bson:"_id"`
	Owner   string `bson:"owner"`
	Balance int64  `bson:"balance"`
	Version int64  `bson:"version"`
}

// exampleDB returns a fresh database on mongotest's server (a real MongoDB
// at MONGODB_URI, or the embedded backend) and a function that drops it.
func exampleDB(name string) (*mongo.Database, func()) {
	srv, err := mongotest.Start(context.Background())
	if err != nil {
		panic(err)
	}
	db := srv.Client.Database("example_versioned_" + name + "_" + bson.NewObjectID().Hex()[16:])
	return db, func() { _ = db.Drop(context.Background()) }
}

// exampleWallets returns a repository over a fresh collection holding
// Ana's wallet with 100.
func exampleWallets(name string) (*versioned.Repo[Wallet], func()) {
	db, drop := exampleDB(name)
	wallets, err := versioned.New[Wallet](db.Collection("wallets"), nil)
	if err != nil {
		panic(err)
	}
	if err := wallets.Insert(context.Background(), &Wallet{ID: "ana", Owner: "Ana", Balance: 100}); err != nil {
		panic(err)
	}
	return wallets, drop
}

func ExampleNew() {
	db, drop := exampleDB("new")
	defer drop()

	wallets, err := versioned.New[Wallet](db.Collection("wallets"), &versioned.Options{
		VersionField: "version", // the default, shown for clarity
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(wallets.Collection().Name())

	// A type without an int64 version field is refused.
	type NoVersion struct {
		ID string `bson:"_id"`
	}
	_, err = versioned.New[NoVersion](db.Collection("other"), nil)
	fmt.Println(errors.Is(err, versioned.ErrInvalid))
	// Output:
	// wallets
	// true
}

func ExampleRepo_Insert() {
	db, drop := exampleDB("insert")
	defer drop()
	ctx := context.Background()
	wallets, err := versioned.New[Wallet](db.Collection("wallets"), nil)
	if err != nil {
		panic(err)
	}

	w := &Wallet{ID: "ana", Owner: "Ana", Balance: 100}
	if err := wallets.Insert(ctx, w); err != nil {
		panic(err)
	}
	// The version is opaque: a random start, then one more per write.
	// Compare versions for equality only.
	fmt.Println("versioned:", w.Version != 0)

	err = wallets.Insert(ctx, &Wallet{ID: "ana", Owner: "Impostor"})
	fmt.Println(errors.Is(err, versioned.ErrDuplicate))
	// Output:
	// versioned: true
	// true
}

func ExampleRepo_Get() {
	wallets, drop := exampleWallets("get")
	defer drop()
	ctx := context.Background()

	w, err := wallets.Get(ctx, "ana")
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s has %d\n", w.Owner, w.Balance)

	_, err = wallets.Get(ctx, "bob")
	fmt.Println(errors.Is(err, versioned.ErrNotFound))
	// Output:
	// Ana has 100
	// true
}

func ExampleRepo_Update() {
	wallets, drop := exampleWallets("update")
	defer drop()
	ctx := context.Background()

	mine, _ := wallets.Get(ctx, "ana")
	theirs, _ := wallets.Get(ctx, "ana")

	mine.Balance = 150
	if err := wallets.Update(ctx, mine); err != nil {
		panic(err)
	}
	fmt.Println("mine is one version on:", mine.Version == theirs.Version+1)

	// theirs was read at the version before: writing it would lose mine.
	theirs.Balance = 90
	err := wallets.Update(ctx, theirs)
	if conflict, ok := errors.AsType[*versioned.ConflictError](err); ok {
		fmt.Println("conflict:", conflict.Expected == theirs.Version, conflict.Current == mine.Version)
	}
	// Output:
	// mine is one version on: true
	// conflict: true true
}

func ExampleRepo_Modify() {
	wallets, drop := exampleWallets("modify")
	defer drop()
	ctx := context.Background()

	before, _ := wallets.Get(ctx, "ana")
	// fn runs on a freshly read copy, again after each conflict.
	w, err := wallets.Modify(ctx, "ana", func(w *Wallet) error {
		w.Balance += 10
		return nil
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(w.Balance, "versions on:", w.Version-before.Version)

	// An error from fn aborts without a write.
	errInsufficient := errors.New("insufficient funds")
	_, err = wallets.Modify(ctx, "ana", func(w *Wallet) error {
		if w.Balance < 500 {
			return errInsufficient
		}
		w.Balance -= 500
		return nil
	})
	fmt.Println(errors.Is(err, errInsufficient))
	// Output:
	// 110 versions on: 1
	// true
}

func ExampleRepo_Guarded() {
	db, drop := exampleDB("guarded")
	defer drop()
	ctx := context.Background()
	type Item struct {
		SKU     string `bson:"_id"`
		Stock   int64  `bson:"stock"`
		Version int64  `bson:"version"`
	}
	items, err := versioned.New[Item](db.Collection("items"), nil)
	if err != nil {
		panic(err)
	}
	mug := &Item{SKU: "mug", Stock: 5}
	if err := items.Insert(ctx, mug); err != nil {
		panic(err)
	}

	// Take 3 if at least 3 are left: one atomic statement, no conflicts.
	take := func(qty int64) (*Item, error) {
		return items.Guarded(ctx, "mug",
			bson.D{{Key: "stock", Value: bson.D{{Key: "$gte", Value: qty}}}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "stock", Value: -qty}}}})
	}
	it, err := take(3)
	if err != nil {
		panic(err)
	}
	fmt.Println("left", it.Stock, "versions on:", it.Version-mug.Version)

	_, err = take(3)
	fmt.Println("sold out:", errors.Is(err, versioned.ErrGuardFailed))
	// Output:
	// left 2 versions on: 1
	// sold out: true
}

func ExampleWhereErr() {
	wallets, drop := exampleWallets("where")
	defer drop()
	ctx := context.Background()
	// A lease record on the document, where the lease package keeps it
	// ("_lease", a field the Wallet type does not map). The lease package's
	// Lease.Fence is such a filter: pass it with lease.ErrLost.
	_, err := wallets.Collection().UpdateOne(ctx, bson.D{{Key: "_id", Value: "ana"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "_lease", Value: bson.D{{Key: "owner", Value: "worker-2"}, {Key: "epoch", Value: 7}}}}}})
	if err != nil {
		panic(err)
	}
	errLeaseLost := errors.New("lease lost")
	fenced := func(owner string, epoch int) versioned.WriteOption {
		return versioned.WhereErr(bson.D{{Key: "_lease.owner", Value: owner}, {Key: "_lease.epoch", Value: epoch}}, errLeaseLost)
	}

	_, err = wallets.Modify(ctx, "ana", func(w *Wallet) error { w.Balance -= 30; return nil }, fenced("worker-1", 6))
	fmt.Println("worker-1:", errors.Is(err, errLeaseLost))

	w, err := wallets.Modify(ctx, "ana", func(w *Wallet) error { w.Balance -= 30; return nil }, fenced("worker-2", 7))
	fmt.Println("worker-2:", err, w.Balance)
	// Output:
	// worker-1: true
	// worker-2: <nil> 70
}

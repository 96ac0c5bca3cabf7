package versioned_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

// Account is the model of the examples: the id and the version are found by
// their bson tags.
type Account struct {
	ID      string `bson:"_id"`
	Balance int64  `bson:"balance"`
	Version int64  `bson:"version"`
}

// The examples need a server: they connect to MONGODB_URI and return when
// it is not set.
func ExampleNew() {
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

	accounts, err := versioned.New[Account](s.Database("example").Collection("accounts"), nil)
	if err != nil {
		fmt.Println(err) // an *versioned.InvalidError: bad options, or a T without _id or version
		return
	}
	err = accounts.Insert(ctx, &Account{ID: "ana", Balance: 100}) // a random first version
	if errors.Is(err, versioned.ErrDuplicate) {
		fmt.Println("ana exists already")
	}
}

func ExampleRepo_Modify() {
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
	accounts, err := versioned.New[Account](s.Database("example").Collection("accounts"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	// fn runs on a freshly read copy; the write applies only if the version
	// is still the one read, and a conflict reads again and calls fn again.
	acct, err := accounts.Modify(ctx, "ana", func(a *Account) error {
		if a.Balance < 30 {
			return errors.New("insufficient funds") // no write; Modify returns it, wrapped
		}
		a.Balance -= 30
		return nil
	})
	var unknown *versioned.UnknownOutcomeError
	switch {
	case errors.Is(err, versioned.ErrNotFound):
		fmt.Println("no account ana")
	case errors.As(err, &unknown):
		fmt.Println("the reply was lost and re-reading could not tell: do not retry blindly")
	case err != nil:
		fmt.Println(err)
	default:
		fmt.Println("balance", acct.Balance)
	}
}

func ExampleRepo_Guarded() {
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
	accounts, err := versioned.New[Account](s.Database("example").Collection("accounts"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	// One atomic statement: take 30 only if at least 30 are there.
	acct, err := accounts.Guarded(ctx, "ana",
		bson.D{{Key: "balance", Value: bson.D{{Key: "$gte", Value: 30}}}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: -30}}}})
	if errors.Is(err, versioned.ErrGuardFailed) {
		fmt.Println("declined")
		return
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("balance", acct.Balance)
}

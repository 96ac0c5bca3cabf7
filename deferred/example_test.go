package deferred_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

type Wallet struct {
	ID      string `bson:"_id"`
	Balance int64  `bson:"balance"`
	Version int64  `bson:"version"`
}

var ErrDeclined = errors.New("declined")

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

	// The jobs collection, and "jobs_keys" beside it.
	jobs, err := deferred.New(s.Database("example").Collection("jobs"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	// Where the server has TTL indexes, finished jobs are deleted after
	// Options.Retention; elsewhere Run sweeps them.
	if _, err := jobs.EnsureIndexes(ctx); err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = jobs.Run(runCtx) }() // workers, in every process that should run them
}

func ExampleChange_ModifyOrEnqueue() {
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
	db := s.Database("example")
	wallets, err := versioned.New[Wallet](db.Collection("wallets"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	jobs, err := deferred.New(db.Collection("jobs"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	// Register the change once at start-up, in every process.
	spend, err := deferred.NewChange(jobs, "wallet.spend", wallets, func(w *Wallet, amount int64) error {
		if w.Balance < amount {
			return retry.Permanent(ErrDeclined) // when queued: dead at once
		}
		w.Balance -= amount
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	res, err := spend.ModifyOrEnqueue(ctx, "ana", 30)
	switch {
	case errors.Is(err, ErrDeclined):
		fmt.Println("402 declined")
	case err != nil:
		fmt.Println(err) // not found, an unknown outcome...: nothing queued
	case res.Queued:
		fmt.Println("202 Accepted, job", res.JobID.Hex())
	default:
		fmt.Println("200 OK, balance", res.Doc.Balance)
	}
}

func ExampleQueue_Wait() {
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
	jobs, err := deferred.New(s.Database("example").Collection("jobs"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	remind, err := deferred.Register(jobs, "remind", func(ctx context.Context, job *deferred.Job, user string) error {
		fmt.Println("reminding", user) // runs at least once: keep side effects idempotent
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = jobs.Run(runCtx) }()

	id, err := remind.Enqueue(ctx, "u42", "u42") // key, argument
	if err != nil {
		fmt.Println(err)
		return
	}
	// Wait reads the job every interval (here 100 ms) until it is completed,
	// dead or cancelled, or ctx ends: for tests, demos and tools.
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	job, err := jobs.Wait(waitCtx, id, 100*time.Millisecond)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(job.State, job.Attempt)
}

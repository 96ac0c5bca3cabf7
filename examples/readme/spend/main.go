// Command spend serves POST /wallets/{id}/spend?amount=N: the change applies
// now (200) or, when the wallet is too busy, is queued and applied later,
// exactly once (202 with the job to poll at GET /jobs/{id}).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
	"github.com/mongocas/mongocas/versioned"
)

type Wallet struct {
	ID      string `bson:"_id"     json:"id"`
	Balance int64  `bson:"balance" json:"balance"`
	Version int64  `bson:"version" json:"-"`
}

var ErrDeclined = errors.New("declined")

// NewService registers the change "wallet.spend" (once at start-up, in
// every instance) and returns the service's HTTP handler.
func NewService(wallets *versioned.Repo[Wallet], jobs *deferred.Queue) (http.Handler, error) {
	spend, err := deferred.NewChange(jobs, "wallet.spend", wallets, func(w *Wallet, amount int64) error {
		if w.Balance < amount {
			return retry.Permanent(ErrDeclined) // when queued: dead at once, not retried
		}
		w.Balance -= amount
		return nil
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /wallets/{id}/spend", func(w http.ResponseWriter, r *http.Request) {
		amount, err := strconv.ParseInt(r.URL.Query().Get("amount"), 10, 64)
		if err != nil || amount <= 0 {
			http.Error(w, "amount: a positive integer", http.StatusBadRequest)
			return
		}
		res, err := spend.ModifyOrEnqueue(r.Context(), r.PathValue("id"), amount)
		switch {
		case errors.Is(err, ErrDeclined):
			http.Error(w, "declined", http.StatusPaymentRequired)
		case errors.Is(err, versioned.ErrNotFound):
			http.Error(w, "no such wallet", http.StatusNotFound)
		case errors.Is(err, deferred.ErrInvalid):
			http.Error(w, err.Error(), http.StatusBadRequest)
		case err != nil: // an unknown outcome, the database unreachable...
			http.Error(w, "try again", http.StatusServiceUnavailable)
		case res.Queued: // Modify's retries ran out on conflicts
			w.Header().Set("Location", "/jobs/"+res.JobID.Hex())
			w.WriteHeader(http.StatusAccepted)
		default:
			writeJSON(w, res.Doc)
		}
	})
	mux.HandleFunc("GET /jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := bson.ObjectIDFromHex(r.PathValue("id"))
		if err != nil {
			http.Error(w, "bad job id", http.StatusBadRequest)
			return
		}
		job, err := jobs.Job(r.Context(), id)
		switch {
		case errors.Is(err, deferred.ErrNotFound):
			http.Error(w, "no such job", http.StatusNotFound)
		case err != nil:
			http.Error(w, "try again", http.StatusServiceUnavailable)
		default:
			writeJSON(w, map[string]any{"state": job.State, "attempt": job.Attempt, "errors": job.Errors})
		}
	})
	return mux, nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		log.Print(err)
	}
}

// open returns the repository and the queue on db.
func open(db *mongo.Database) (*versioned.Repo[Wallet], *deferred.Queue, error) {
	wallets, err := versioned.New[Wallet](db.Collection("wallets"), nil)
	if err != nil {
		return nil, nil, err
	}
	jobs, err := deferred.New(db.Collection("jobs"), nil) // and "jobs_keys" beside it
	return wallets, jobs, err
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The server at MONGODB_URI; with none, one started for trying this (Docker,
	// else embedded). mongotest is for tests and trials: a service dials its own.
	srv, err := mongotest.Start(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("server:", srv)
	err = serve(ctx, srv.URI, "localhost:8080")
	mongotest.Shutdown() // stops a server it started and removes its data
	if err != nil {
		log.Fatal(err)
	}
}

// serve serves the wallets at addr until ctx ends.
func serve(ctx context.Context, uri, addr string) error {
	s, err := store.Connect(ctx, uri, nil)
	if err != nil {
		return err
	}
	defer s.Close(context.WithoutCancel(ctx))
	wallets, jobs, err := open(s.Database("shop"))
	if err != nil {
		return err
	}
	if _, err := jobs.EnsureIndexes(ctx); err != nil { // the TTL index that deletes finished jobs
		return err
	}
	handler, err := NewService(wallets, jobs)
	if err != nil {
		return err
	}
	go func() { log.Print(jobs.Run(ctx)) }() // the workers, in every instance that should run them
	hs := &http.Server{Addr: addr, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { <-ctx.Done(); _ = hs.Shutdown(context.WithoutCancel(ctx)) }() // Ctrl-C
	if err := hs.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

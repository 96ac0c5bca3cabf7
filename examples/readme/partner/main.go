// Command partner switches a user's primary identity at a slow partner API.
package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

// Partner is a slow external API that dedupes calls on a key.
type Partner func(ctx context.Context, key, userID, identity string) error

// Switch runs once per idempotency key and one request per user at a time,
// holding no transaction, lock or connection during the partner call.
func Switch(ctx context.Context, keys *idempotency.Keys, leases *lease.Manager, partner Partner, key, userID, identity string) (idempotency.Result, error) {
	return keys.Do(ctx, key, []byte(userID+" "+identity), func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		err := leases.Do(ctx, userID, func(ctx context.Context, l *lease.Lease) error {
			// ctx ends if the lease is lost; a step runs once across retries.
			_, err := c.Step(ctx, "partner", func(ctx context.Context, partnerKey string) ([]byte, error) {
				return nil, partner(ctx, partnerKey, userID, identity)
			})
			if err != nil {
				return err
			}
			// Fenced: the write applies only while this lease is held.
			res, err := leases.Collection().UpdateOne(ctx, append(bson.D{{Key: "_id", Value: userID}}, l.Fence()...),
				bson.D{{Key: "$set", Value: bson.D{{Key: "primary", Value: identity}}}})
			if err == nil && res.MatchedCount == 0 {
				return lease.ErrLost
			}
			return err
		})
		if err != nil {
			return idempotency.Result{}, err // transient: not stored, a retry runs again
		}
		return idempotency.Result{Status: http.StatusOK}, nil // final: stored, replayed
	})
}

func main() {
	ctx := context.Background()
	// The server at MONGODB_URI; with none, one started for trying this (Docker,
	// else embedded). mongotest is for tests and trials: a service dials its own.
	srv, err := mongotest.Start(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("server:", srv)
	err = run(ctx, srv.URI, "shop")
	mongotest.Shutdown() // stops a server it started and removes its data
	if err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, uri, database string) error {
	s, err := store.Connect(ctx, uri, nil)
	if err != nil {
		return err
	}
	defer s.Close(ctx)
	users := s.Database(database).Collection("users")
	if _, err := users.InsertOne(ctx, bson.D{{Key: "_id", Value: "u42"}}); err != nil && !store.IsDuplicateKey(err) {
		return err
	}
	leases, err := lease.New(users, &lease.Options{TTL: 30 * time.Second}) // above the slowest call
	if err != nil {
		return err
	}
	keys, err := idempotency.New(s.Database(database).Collection("idempotency_keys"), nil)
	if err != nil {
		return err
	}
	partner := func(_ context.Context, key, userID, identity string) error {
		fmt.Println("partner:", userID, identity, "key", key)
		return nil
	}
	for range 2 { // a request, and the client's retry of it
		res, err := Switch(ctx, keys, leases, partner, "req-7f3c", "u42", "google")
		if err != nil {
			return err // an *idempotency.InProgressError is a 409 while the first runs
		}
		fmt.Println(res.Status, "replayed:", res.Replayed)
	}
	return nil
}

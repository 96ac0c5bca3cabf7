// Command charge charges an order once, however often the client retries
// with the same idempotency key.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

// ErrDeclined is the PSP's answer for a card it declines.
var ErrDeclined = errors.New("declined")

// PSP is a payment provider that dedupes charges on an idempotency key.
type PSP func(ctx context.Context, idempotencyKey, order string, amount int64) (chargeID string, err error)

// ChargeOnce runs once per key: a retry gets the stored result (Replayed),
// a retry while it runs an *idempotency.InProgressError (409), the key
// with another order or amount an *idempotency.MismatchError (422).
func ChargeOnce(ctx context.Context, keys *idempotency.Keys, psp PSP, key, order string, amount int64) (idempotency.Result, error) {
	fingerprint := fmt.Appendf(nil, "%s %d", order, amount)
	return keys.Do(ctx, key, fingerprint, func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		// A step runs once across the request's retries, with the same
		// partner key in each, so the PSP dedupes a call whose reply died.
		charge, err := c.Step(ctx, "charge", func(ctx context.Context, partnerKey string) ([]byte, error) {
			id, err := psp(ctx, partnerKey, order, amount)
			return []byte(id), err
		})
		if errors.Is(err, ErrDeclined) {
			return idempotency.Result{Status: http.StatusPaymentRequired}, nil // final: stored, replayed
		}
		if err != nil {
			return idempotency.Result{}, err // transient: not stored, a retry runs again
		}
		return idempotency.Result{Status: http.StatusCreated, Body: charge}, nil // final: stored
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
	keys, err := idempotency.New(s.Database(database).Collection("idempotency_keys"), nil)
	if err != nil {
		return err
	}
	if _, err := keys.EnsureIndexes(ctx); err != nil { // records deleted 24 h after their request
		return err
	}
	psp := func(_ context.Context, key, order string, amount int64) (string, error) {
		fmt.Println("psp: charge", order, amount, "key", key)
		return "ch_" + order, nil
	}
	for range 2 { // the client's first try, and its retry
		res, err := ChargeOnce(ctx, keys, psp, "3f9a", "order-1", 250)
		if err != nil {
			return err
		}
		fmt.Println(res.Status, string(res.Body), "replayed:", res.Replayed)
	}
	return nil
}

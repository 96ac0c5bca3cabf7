package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/mongotest"
)

// exampleDB returns a fresh database on mongotest's server and a function
// that drops it. Real code uses its own *mongo.Database.
func exampleDB() (*mongo.Database, func()) {
	ctx := context.Background()
	srv, err := mongotest.Start(ctx)
	if err != nil {
		panic(err)
	}
	db := srv.Client.Database("example_idempotency_" + bson.NewObjectID().Hex())
	return db, func() { _ = db.Drop(ctx) }
}

// A charge runs once per key: the retry gets the stored result, and the
// same key with another amount is refused.
func ExampleKeys_Do() {
	db, drop := exampleDB()
	defer drop()
	ctx := context.Background()
	keys, err := idempotency.New(db.Collection("idempotency_keys"), nil)
	if err != nil {
		panic(err)
	}
	charges := 0
	charge := func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		id, err := c.Step(ctx, "charge", func(_ context.Context, partnerKey string) ([]byte, error) {
			charges++ // psp.Charge(ctx, partnerKey, ...): the partner dedupes on partnerKey
			return []byte("ch_1"), nil
		})
		if err != nil {
			return idempotency.Result{}, err // transient: not stored, a retry runs again
		}
		return idempotency.Result{Status: 201, Body: id}, nil // final: stored
	}

	for range 2 {
		res, err := keys.Do(ctx, "order-7f3a", []byte("10 EUR"), charge)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%d %s replayed=%v\n", res.Status, res.Body, res.Replayed)
	}
	_, err = keys.Do(ctx, "order-7f3a", []byte("99 EUR"), charge)
	fmt.Println(errors.Is(err, idempotency.ErrMismatch), "charges:", charges)
	// Output:
	// 201 ch_1 replayed=false
	// 201 ch_1 replayed=true
	// true charges: 1
}

// The middleware answers a retry with the first response, marked
// Idempotent-Replayed, and a request without a key with 400.
func ExampleKeys_Handler() {
	db, drop := exampleDB()
	defer drop()
	keys, err := idempotency.New(db.Collection("idempotency_keys"), nil)
	if err != nil {
		panic(err)
	}
	orders := 0
	create := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		orders++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", orders)
	})
	h, err := keys.Handler(create, nil)
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	post := func(key string) {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"mug"}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), strings.SplitN(string(body), ",", 2)[0])
	}
	post("8e03978e-40d5-43e8-bc93-6894a57f9324")
	post("8e03978e-40d5-43e8-bc93-6894a57f9324")
	post("")
	// Output:
	// 201  order 1
	// 201 true order 1
	// 400  {"type":"about:blank"
}

package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/store"
)

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

	keys, err := idempotency.New(s.Database("example").Collection("idempotency_keys"), nil)
	if err != nil {
		fmt.Println(err) // an *idempotency.OptionsError
		return
	}
	// Records are deleted Retention (24 h) after their request last ran: by
	// a TTL index where the server has them, else call keys.Sweep now and then.
	ttl, err := keys.EnsureIndexes(ctx)
	fmt.Println(ttl, err)
}

func ExampleKeys_Do() {
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
	keys, err := idempotency.New(s.Database("example").Collection("idempotency_keys"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	charge := func(ctx context.Context, partnerKey string) ([]byte, error) {
		return []byte("ch_1"), nil // the payment provider, deduping on partnerKey
	}

	res, err := keys.Do(ctx, "3f9a", []byte("order-1 250"), func(ctx context.Context, c *idempotency.Call) (idempotency.Result, error) {
		id, err := c.Step(ctx, "charge", charge) // once across the retries of this key
		if err != nil {
			return idempotency.Result{}, err // transient: not stored, a retry runs again
		}
		return idempotency.Result{Status: http.StatusCreated, Body: id}, nil // final: stored
	})
	var inProgress *idempotency.InProgressError
	switch {
	case errors.As(err, &inProgress):
		fmt.Println("409, Retry-After", inProgress.TimeLeft)
	case errors.Is(err, idempotency.ErrMismatch):
		fmt.Println("422: the key was used for another request")
	case err != nil:
		fmt.Println(err)
	default:
		fmt.Println(res.Status, string(res.Body), "replayed:", res.Replayed)
	}
}

func ExampleKeys_Handler() {
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
	keys, err := idempotency.New(s.Database("example").Collection("idempotency_keys"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := idempotency.CallFrom(r.Context()) // the request's run under its key
		if _, err := c.Step(r.Context(), "create", func(context.Context, string) ([]byte, error) {
			return nil, nil // create the order
		}); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // 5xx: not stored
			return
		}
		w.WriteHeader(http.StatusCreated) // stored, replayed to retries
	})
	// Idempotency-Key header; 409 while the first runs, 422 for another
	// request with the key, 400 without a key; replays say Idempotent-Replayed.
	handler, err := keys.Handler(orders, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	http.Handle("POST /orders", handler)
}

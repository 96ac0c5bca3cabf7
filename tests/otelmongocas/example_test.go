package otelmongocas_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/otelmongocas"
	"github.com/mongocas/mongocas/versioned"
)

// New with an SDK's TracerProvider (a program passes its own, or nil for
// the global one): each operation is a span named "<operation>
// <collection>", with its outcome. The package documentation links here.
func ExampleNew() {
	ctx := context.Background()
	db, drop, err := mongotest.Open(ctx, "otel_example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = drop(ctx) }()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer func() { _ = tp.Shutdown(ctx) }()

	obs, err := otelmongocas.New(&otelmongocas.Options{TracerProvider: tp})
	if err != nil {
		fmt.Println(err)
		return
	}
	accounts, err := versioned.New[account](db.Collection("accounts"), &versioned.Options{Observer: obs})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = accounts.Insert(ctx, &account{ID: "ana", Balance: 10})
	_ = accounts.Insert(ctx, &account{ID: "ana"}) // a duplicate: not a failure of the library
	_, _ = accounts.Modify(ctx, "ana", func(a *account) error { a.Balance += 5; return nil })

	for _, s := range spans.GetSpans() {
		outcome := ""
		for _, kv := range s.Attributes {
			if kv.Key == attribute.Key("mongocas.outcome") {
				outcome = kv.Value.AsString()
			}
		}
		fmt.Println(s.Name, outcome, s.Status.Code)
	}
	// Output:
	// insert accounts ok Unset
	// insert accounts duplicate Unset
	// modify accounts ok Unset
}

module github.com/mongocas/mongocas/otelmongocas

go 1.25.0

require (
	github.com/mongocas/mongocas v0.0.0-00010101000000-000000000000
	go.opentelemetry.io/otel v1.44.0
	go.opentelemetry.io/otel/metric v1.44.0
	go.opentelemetry.io/otel/trace v1.44.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
)

// The library, until it is tagged; go.work ties the modules together for
// development.
replace github.com/mongocas/mongocas v0.0.0-00010101000000-000000000000 => ../

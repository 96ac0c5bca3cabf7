module github.com/mongocas/mongocas/cmd/mongocas

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/mongocas/mongocas v0.0.0-00010101000000-000000000000
	github.com/mongocas/mongocas/mongotest v0.0.0-00010101000000-000000000000
	go.mongodb.org/mongo-driver/v2 v2.10.0
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/xdg-go/scram v1.4.0 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	github.com/youmark/pkcs8 v0.0.0-20240726163527-a2c0da244d78 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

// The repository's own modules, until they are tagged; go.work ties the
// modules together for development. `go run
// github.com/mongocas/mongocas/cmd/mongocas@latest` refuses a module with
// replace directives: a release points these requirements at the tags and
// drops the replace block (as for mongotest).
replace (
	github.com/mongocas/mongocas v0.0.0-00010101000000-000000000000 => ../../
	github.com/mongocas/mongocas/mongotest v0.0.0-00010101000000-000000000000 => ../../mongotest
)

# mongocas developer targets. Every test target runs against a real
# MongoDB-wire server: MONGODB_URI if set, else Docker, else embedded FerretDB;
# test-documentdb builds and starts FerretDB v2 on DocumentDB for its run.
#
# The repository is nine modules tied by go.work: the library (root),
# mongotest, mongotest/ferretdbserver and mongotest/mongodbserver (the
# embedded server's and the Docker backend's commands, which mongotest builds
# and runs as child processes), tests (the server-backed tests), examples,
# cmd/mongocas (the operator CLI), otelmongocas (the OpenTelemetry adapter)
# and internal/bench. `./...` stops at module boundaries; the module path
# pattern covers them all.
GO ?= go
GOLANGCI_LINT ?= golangci-lint
GOLANGCI_LINT_VERSION ?= v2.15.0
PKGS ?= github.com/mongocas/mongocas/...
# golangci-lint takes directories, one pattern per module.
LINT_DIRS ?= ./... ./mongotest/... ./mongotest/ferretdbserver/... ./mongotest/mongodbserver/... ./tests/... ./examples/... ./otelmongocas/... ./internal/bench/...

.PHONY: documentdb-up documentdb-down all demo test test-race test-short test-min-go test-documentdb lint lint-install fmt vet deps-check bench bench-contention fuzz ci

all: vet test

demo: ## the README's first command
	$(GO) run ./examples/demo

test: ## the README's second command
	$(GO) test -race -count=1 $(PKGS)

test-race: test

test-short:
	$(GO) test -count=1 $(PKGS)

test-min-go: ## the root module alone, with the Go version its go.mod declares
	GOWORK=off GOTOOLCHAIN=go$$(awk '/^go /{print $$2}' go.mod) $(GO) test -count=1 ./...

# FerretDB v2 + DocumentDB from ../shared/backends/documentdb (override with
# MONGOCAS_DOCUMENTDB_DIR): build.sh if not built yet (as root, through sudo
# when needed; 12-16 min once), start.sh in a temporary directory on free
# ports, the suite without -race, stop.sh. The same stage as CI's.
# documentdb-up starts FerretDB v2 on DocumentDB (built once, from the kit at
# MONGOCAS_DOCUMENTDB_DIR or ../shared/backends/documentdb) on its default
# ports, in $(DDB_RUN), and records its URI where mongotest looks for a second
# server: from then on a plain `go test` runs the tests that need what the
# embedded server lacks ($expr, $$NOW, TTL indexes) on it. documentdb-down
# stops it and forgets it.
DDB_DIR ?= $(or $(MONGOCAS_DOCUMENTDB_DIR),../shared/backends/documentdb)
# PostgreSQL runs as the postgres user: its state directory must not be under
# a home directory it cannot enter (root's is 0700).
DDB_RUN ?= /var/tmp/mongocas-documentdb
# sudo where it is needed and present; root runs the scripts directly.
SUDO ?= $(if $(filter 0,$(shell id -u)),,sudo)
DDB_URI_FILE = $(HOME)/.cache/mongocas/alt-server.uri

documentdb-up: ## start the DocumentDB backend here; mongotest uses it as its second server
	$(SUDO) bash $(DDB_DIR)/build.sh
	mkdir -p $(DDB_RUN) $(dir $(DDB_URI_FILE)) && $(SUDO) env RUN=$(DDB_RUN) bash $(DDB_DIR)/start.sh | tail -1 > $(DDB_URI_FILE)
	@echo "second server: $$(cat $(DDB_URI_FILE)) (recorded in $(DDB_URI_FILE))"

documentdb-down:
	rm -f $(DDB_URI_FILE)
	$(SUDO) env RUN=$(DDB_RUN) bash $(DDB_DIR)/stop.sh

test-documentdb: ## the suite on FerretDB v2 + DocumentDB, no proxy
	PKGS='$(PKGS)' bash .ci/run documentdb

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

lint:
	$(GOLANGCI_LINT) run $(LINT_DIRS)

lint-install:
	$(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

deps-check: ## what a user's module gets, with and without mongotest: no test-only modules, a small go.sum
	bash .ci/deps-check

bench: ## each operation beside the raw driver doing the same work
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=200x ./tests/versioned ./tests/lease ./retry

# One bounded run (-timeout, default 15m) of internal/bench: read-modify-write
# of one document at N = 1..32 writers in one process and in 4, with Modify,
# Guarded, a raw-driver CAS loop and docstore's strategy, and lease contention;
# prints the tables and writes bench.png. The server runs in another process
# (embedded FerretDB as a child process, or MONGODB_URI).
BENCH_FLAGS ?=
bench-contention: ## contention tables and plot (go run ./internal/bench)
	$(GO) run ./internal/bench $(BENCH_FLAGS)

fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzJitterBounds -fuzztime=20s ./retry
	$(GO) test -run='^$$' -fuzz=FuzzParseCommand -fuzztime=20s ./mongotest/internal/wireproxy

ci:
	bash .ci/run

// Package mongotest gives a test a real MongoDB-wire server in one call, on
// any machine, and injects faults into its traffic.
//
//	func TestMain(m *testing.M) { mongotest.Main(m) } // or Main(m, mongotest.CheckLeaks())
//
//	func TestSomething(t *testing.T) {
//		db := mongotest.New(t) // a fresh database, dropped when t ends
//		coll := db.Collection("accounts")
//		...
//	}
//
// # Backends
//
// The first call to New or Start picks one server for the whole test binary:
//
//  1. the server at MONGODB_URI, when it is set (real MongoDB, Atlas, ...);
//  2. else a single-node MongoDB replica set in Docker, when an engine
//     answers: the image mongo:<MONGOCAS_MONGODB_VERSION> (6.0, 7.0, 8.0;
//     7.0 when unset; MONGOCAS_DOCKER_IMAGE names another image), started by
//     testcontainers-go's MongoDB module in a child process, the command
//     github.com/mongocas/mongocas/mongotest/mongodbserver, built like the
//     embedded server's below (MONGOCAS_MONGODBSERVER_VERSION), so that
//     neither testcontainers-go nor a Docker client enters your module graph.
//     mongotest looks for a socket where an engine listens (DOCKER_HOST, the
//     usual places) without speaking its API; the child asks the engine, and
//     when none answers Start falls back to the embedded server, and the line
//     that names the backend says why. The child removes the container when
//     the test process exits; if both die, testcontainers-go's reaper (Ryuk)
//     does;
//  3. else FerretDB v1 (SQLite handler, files in a temporary directory on
//     /dev/shm when it exists) in a child process, reached through a proxy
//     that serializes wire exchanges. The child is the command
//     github.com/mongocas/mongocas/mongotest/ferretdbserver, a module of its
//     own, so that neither FerretDB nor the database drivers it links enter
//     your module graph. mongotest builds it once with the go command, into
//     the user cache directory under a name keyed by what it is built from
//     (the newest three are kept): from the sources beside mongotest's own
//     when there are some (this repository, a local replace), else with
//     `go install github.com/mongocas/mongocas/mongotest/ferretdbserver@V`,
//     V being mongotest's own version as this binary's build information
//     records it (the commit, for a pseudo-version), which needs the module
//     proxy once; MONGOCAS_FERRETDBSERVER_VERSION overrides V. The first
//     build takes one to three minutes; it says what it builds, how long the
//     last build took, and every few seconds how long it has been going.
//
// A test binary says once, in a line that shows without -v, which backend it
// uses. Such lines go to the go command's standard error when it is a
// terminal or a pipe (Linux), else to the terminal, else to standard error.
//
// MONGOCAS_BACKEND=uri|docker|embedded forces one. [Server].Caps says what the
// backend can do, as [store.Probe] found it by trying each feature, and which
// kind of server it is (MongoDB, FerretDB v1, FerretDB v2); [DB.Require] skips
// a test, saying why, when a capability is missing. A skipped test is
// reported as skipped, never as passed.
//
// # A second server for what the first lacks
//
// Use(t, caps...) (and NewWith) route t's databases, and its subtests', to a
// server that has the capabilities a test needs when the shared one lacks
// them: the embedded FerretDB v1 has no $expr, no $$NOW in writes, no update
// pipelines and no TTL indexes, which the lease package's server-judged mode
// and the TTL tests need. The second server is the one at MONGOCAS_ALT_URI,
// or the one recorded in the file alt-server.uri of the user cache
// directory's mongocas folder (make documentdb-up starts FerretDB v2 on
// DocumentDB on this machine and records it there) when it answers. Where
// there is none, the test is skipped, saying so and how to get one; CI
// starts DocumentDB before the embedded stage and passes it as
// MONGOCAS_ALT_URI, so no stage skips those tests.
//
// # FerretDB v2 on DocumentDB
//
// MONGODB_URI may name FerretDB v2 in front of PostgreSQL with the
// DocumentDB extension (the engine of Azure Cosmos DB for MongoDB vCore).
// CI builds and starts one from ../shared/backends/documentdb and runs the
// whole suite on it (make test-documentdb does the same on a developer's
// machine). Clients reach it directly, with no proxy: its storage engine runs
// our concurrent writes itself, and the self-test below holds there too. It
// has $expr and $$NOW in write filters and update pipelines, and TTL indexes,
// so the tests that need them run; it has no multi-document transactions
// (startTransaction is accepted and each write applies at once; Probe checks
// the effect and reports none). It answers a duplicate key inside
// findAndModify with an InternalError, which [store.IsDuplicateKey] recognises.
//
// # What the embedded backend proves, and what it does not
//
// FerretDB v1 applies a conditional update by reading the document, changing
// it in Go and writing it back by _id without re-checking the filter, so
// under concurrency it loses updates and grants a lease twice. The proxy
// holds one lock from sending a request to FerretDB until its reply is read,
// so at most one operation runs at the server at a time. That models
// MongoDB's documented single-document atomicity, which is all mongocas relies
// on, and the self-test in this package shows it holds: 16 × 200 version-CAS
// increments end at exactly 3,200 and a 32-way claim race has exactly one
// winner in each of 200 rounds. It proves nothing about a storage engine
// running writes concurrently (FerretDB v2 on DocumentDB does that), nor about
// mongod's replication, elections or retryable writes; run the suite against
// real MongoDB (MONGODB_URI or Docker) for those.
//
// # Faults
//
// [DB.Faulty] returns a second client to the same database whose traffic passes
// through a proxy of its own, so one test's faults never touch another's. A
// Match (Writes, Commands) picks the requests a fault acts on; each fault
// acts once (DropReplies: n times) and reports through Fault.HasFired, Fired
// and Matched. When several armed faults match a request, the one armed
// first acts.
//
//   - DropNextReply: the server applies the write, the client gets a network
//     error (an ambiguous write).
//   - WriteConcernErrorNext: the server applies the write, the client gets
//     the reply with a writeConcernError (code, codeName, errmsg, errInfo,
//     errorLabels) added; WriteConcernTimeout is a canned one.
//   - ErrorAfterApply: the server applies the write, the client gets an
//     error reply instead (ServerError; NotWritablePrimary is a canned one,
//     labelled RetryableWriteError).
//   - ErrorBeforeApply: the write never reaches the server, the client gets
//     the error reply.
//   - HoldNext: a late copy. The write is kept at the proxy and the client's
//     connection closed, so the client gets a network error for a write the
//     server has not seen; it may re-read and resend; Fault.Deliver then
//     sends the kept copy to the server, when the test decides, and returns
//     the server's reply to it. "At most one copy applies" is then tested
//     with two copies really reaching the server.
//   - DelayReplies, Pause (hold all traffic for a while), ResetConnections.
//
// The driver's retryable writes are off for that client by default, so the
// fault reaches the code under test on every backend. On the embedded
// backend every exchange of the fault proxy, a delivered late copy included,
// takes the serializing lock like the shared client's. The proxy forwards
// unacknowledged (w:0) writes as acknowledged ones and waits for their reply
// under the lock, never lets a server stream exhaust replies, and refuses
// traffic it cannot keep serialized or inspect (compressed or legacy
// messages) with an error reply; Faulty.Err reports such a refusal and the
// test fails at cleanup.
//
// # Guarantees
//
//   - New returns a database no other test uses, and drops it at cleanup.
//   - One server per test binary; [Main] stops it and removes its files. With
//     [CheckLeaks] it also fails the run if a goroutine outlives the tests.
//   - Start bounds each backend's start: MONGODB_URI is given up on after its
//     server-selection timeout (10 s); Docker is tried only when a socket
//     accepts a connection within two seconds, and its child gives up when
//     the engine does not answer within five.
//
// # Errors
//
//   - [ErrNoServer]: no backend could give a server; the error says which
//     backend failed, why (an unreachable or malformed MONGODB_URI is named
//     with its password redacted), and what to do about it ("To fix: start
//     Docker, or unset MONGOCAS_BACKEND ..."). [New] fails the test with it.
package mongotest

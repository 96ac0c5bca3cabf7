package mongotest_test

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/mongotest"
)

// childEnv tells this test binary, run again as a child by the tests below,
// what to do instead of its tests.
const childEnv = "MONGOTEST_TEST_CHILD"

// leakChild runs instead of the tests when childEnv says "leak" or
// "leak-checked": it writes to a fresh database on the shared server, leaves
// a goroutine running, and hands over to Main, with CheckLeaks for
// "leak-checked". It reports whether it ran (Main exits, so it returns only
// false).
func leakChild(m *testing.M) bool {
	mode := os.Getenv(childEnv)
	if mode != "leak" && mode != "leak-checked" {
		return false
	}
	ctx := context.Background()
	db, drop, err := mongotest.Open(ctx, "leak child")
	if err != nil {
		panic(err)
	}
	if _, err := db.Collection("c").InsertOne(ctx, bson.D{{Key: "x", Value: 1}}); err != nil {
		panic(err)
	}
	if err := drop(ctx); err != nil {
		panic(err)
	}
	block := make(chan struct{})
	go func() { <-block }() // the leak: nobody closes block
	if mode == "leak-checked" {
		mongotest.Main(m, mongotest.CheckLeaks())
	}
	mongotest.Main(m)
	return true
}

// runChild runs this test binary again with env added, running only the
// tests run matches ("^$": none), and returns its output and exit error.
func runChild(t *testing.T, run string, env ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+run, "-test.count=1", "-test.v") //nolint:gosec // this test binary
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestLeakCheckIsOptIn: a test binary that leaves a goroutine running passes
// under Main, and fails, naming the goroutine, under Main with CheckLeaks.
func TestLeakCheckIsOptIn(t *testing.T) {
	t.Parallel()
	out, err := runChild(t, "^$", childEnv+"=leak")
	require.NoError(t, err, "without CheckLeaks the leaky binary must pass:\n%s", out)
	require.NotContains(t, out, "goroutines left running")

	out, err = runChild(t, "^$", childEnv+"=leak-checked")
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "with CheckLeaks the leaky binary must fail:\n%s", out)
	require.Contains(t, out, "mongotest: goroutines left running after the tests and Shutdown")
	require.Contains(t, out, "leakChild")
}

// TestDockerAbsentSaysWhatToDo: forcing the Docker backend where no engine
// answers fails the test that asked for a server with one message that says
// what was tried and how to fix it, with its prefix once.
func TestDockerAbsentSaysWhatToDo(t *testing.T) {
	t.Parallel()
	out, err := runChild(t, "^TestSelfTestVersionCAS$",
		mongotest.EnvBackend+"=docker", "DOCKER_HOST=unix://"+t.TempDir()+"/docker.sock")
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "the test must fail:\n%s", out)
	var line string
	for l := range strings.Lines(out) {
		if strings.Contains(l, "no MongoDB-wire server") {
			line = l
		}
	}
	require.NotEmpty(t, line, "no start-up error in:\n%s", out)
	t.Logf("the child said: %s", strings.TrimSpace(line))
	require.Equal(t, 1, strings.Count(line, "mongotest: "), line)
	for _, want := range []string{
		"MONGOCAS_BACKEND=docker", "no Docker engine answered", "docker.sock",
		"start Docker", "unset MONGOCAS_BACKEND to use the embedded server", "MONGODB_URI",
	} {
		require.Contains(t, line, want)
	}
}

// TestBackendLineShowsWithoutVerbose: go test shows nothing a passing
// package's test binary writes unless run with -v; the line that says which
// backend the package used reaches the go command's standard error anyway.
func TestBackendLineShowsWithoutVerbose(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test (-short)")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the go command's standard error is found through /proc")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-run=^TestCapabilitiesReported$", ".")
	var stdout, stderr strings.Builder // pipes, as in a CI log
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s\n%s", stdout.String(), stderr.String())
	require.Contains(t, stdout.String(), "ok  \tgithub.com/mongocas/mongocas/mongotest")
	require.NotContains(t, stdout.String(), "TestCapabilitiesReported", "not verbose")
	var found string
	for l := range strings.Lines(stderr.String()) {
		if strings.HasPrefix(l, "mongotest: mongotest: ") { //nolint:dupword // the notices' prefix, then the test binary's name: this package's
			require.Empty(t, found, "one line per package:\n%s", stderr.String())
			found = l
		}
	}
	require.NotEmpty(t, found, "no backend line in the go command's stderr:\n%s", stderr.String())
	t.Logf("go test said: %s", strings.TrimSpace(found))
}

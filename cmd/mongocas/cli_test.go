package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

func TestMain(m *testing.M) { mongotest.Main(m) }

var (
	buildOnce sync.Once
	binPath   string
	errBuild  error
)

// binary builds the command once per test run, when the first test needs it,
// into a temporary directory that outlives that test.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "mongocas-cli-*") //nolint:usetesting // every later test runs this binary: t.TempDir would remove it with the first test
		if err != nil {
			errBuild = err
			return
		}
		binPath = filepath.Join(dir, "mongocas")
		out, err := exec.CommandContext(t.Context(), "go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			errBuild = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if errBuild != nil {
		t.Fatal(errBuild)
	}
	return binPath
}

// result is one run of the binary.
type result struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// run runs the binary with args and stdin ("" for none), without
// MONGODB_URI in its environment.
func run(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	bin := binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "MONGODB_URI=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return r
}

// on returns the flags that point the binary at db.
func on(db *mongotest.DB) []string {
	return []string{"--uri", db.Server.URI, "--db", db.Name()}
}

func args(db *mongotest.DB, a ...string) []string { return append(a, on(db)...) }

func decode(t *testing.T, r result, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("decode the --json output: %v\nstdout: %s\nstderr: %s", err, r.stdout, r.stderr)
	}
}

func wantCode(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
}

// TestDoctor checks doctor's capability lines against store.Probe, its lease
// mode, and that it finds missing indexes, says how to fix them, and --fix
// makes them.
func TestDoctor(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	caps, err := store.Probe(ctx, db.Database)
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, "", args(db, "doctor", "--jobs", "jobs", "--keys", "idem", "--leases", "locks")...)
	t.Logf("doctor on the %s backend:\n%s", db.Server.Backend, r.stdout)
	wantCode(t, r, 1) // no index exists yet
	if !strings.Contains(r.stdout, "MISSING") || !strings.Contains(r.stdout, "to fix: run mongocas doctor --fix") {
		t.Errorf("no missing index with its fix in:\n%s", r.stdout)
	}
	want := map[string]bool{
		"transactions": caps.Transactions, "retryable writes": caps.RetryableWrites,
		"$expr/$$NOW in writes": caps.Expr, "$$NOW in update pipelines": caps.UpdatePipelines, "TTL indexes": caps.TTLIndexes,
	}
	for name, present := range want {
		line := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+(yes|no)\s`).FindStringSubmatch(r.stdout)
		if line == nil {
			t.Errorf("no capability line %q", name)
			continue
		}
		if got := line[1] == "yes"; got != present {
			t.Errorf("capability %q: doctor says %s, store.Probe says %v", name, line[1], present)
		}
	}
	mode := "estimated"
	if caps.Expr && caps.UpdatePipelines {
		mode = "server"
	}
	if !regexp.MustCompile(`(?m)^lease mode\s+` + mode + `\s`).MatchString(r.stdout) {
		t.Errorf("lease mode: want %s", mode)
	}
	if !regexp.MustCompile(`(?m)^server clock\s+[+-][0-9.]+ms\s+from this host's, within ±[0-9.]+ms`).MatchString(r.stdout) {
		t.Errorf("no clock offset and bound")
	}
	// Its probes leave no scratch collection behind.
	left, err := db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: bson.D{{Key: "$regex", Value: "^" + store.ProbeCollection}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("doctor left probe collections behind: %v", left)
	}

	rj := run(t, "", args(db, "doctor", "--json", "--jobs", "jobs", "--keys", "idem", "--leases", "locks", "--fix")...)
	wantCode(t, rj, 0)
	var rep struct {
		Server, Version, Topology string
		Capabilities              []struct {
			Name    string
			Present bool
		}
		LeaseMode string
		Indexes   []struct {
			Collection, Keys string
			Needed, Present  bool
		}
		Problems []any
	}
	decode(t, rj, &rep)
	if rep.Server != string(caps.Server) || rep.Version != caps.Version || rep.Topology != string(caps.Topology) || rep.LeaseMode != mode {
		t.Errorf("doctor --json says %s %s %s %s; store.Probe %s %s %s, mode %s", rep.Server, rep.Version, rep.Topology, rep.LeaseMode,
			caps.Server, caps.Version, caps.Topology, mode)
	}
	for _, c := range rep.Capabilities {
		if want[c.Name] != c.Present {
			t.Errorf("--json capability %q: %v, store.Probe %v", c.Name, c.Present, want[c.Name])
		}
	}
	for _, ix := range rep.Indexes {
		if ix.Needed && !ix.Present {
			t.Errorf("after --fix, index %s on %s is still missing", ix.Keys, ix.Collection)
		}
	}
	// The indexes are really there.
	specs, err := db.Collection("jobs").Indexes().ListSpecifications(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(specs))
	for _, s := range specs {
		names = append(names, s.Name)
	}
	if len(specs) < 4 { // _id, p, state, expireAt
		t.Errorf("jobs has indexes %v after --fix", names)
	}
	wantCode(t, run(t, "", args(db, "doctor", "--jobs", "jobs", "--keys", "idem", "--leases", "locks")...), 0)
}

// TestConnectionErrors: a bad URI, a wrong password, an unreachable server
// give a clear error, with a fix, within the timeout; no password is printed
// and nothing is changed.
func TestConnectionErrors(t *testing.T) {
	db := mongotest.New(t)
	const pw = "n0tTheRealPassword"
	host, _, _ := strings.Cut(strings.TrimPrefix(db.Server.URI, "mongodb://"), "/")
	if i := strings.LastIndex(host, "@"); i >= 0 {
		host = host[i+1:]
	}
	cases := []struct {
		name, uri, fix string
		maxTook        time.Duration
	}{
		{"bad URI", "mongo://bob:" + pw + "@" + host + "/x", "check the URI's syntax", 5 * time.Second},
		{"unreachable", "mongodb://bob:" + pw + "@127.0.0.1:1/x", "reachable from here", 2*time.Second + 3*time.Second},
		{"wrong password", "mongodb://mongocas-nobody:" + pw + "@" + host + "/" + db.Name() + "?directConnection=true", "password", 5 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// jobs first: it only reads, so on a backend without authentication
			// it changes nothing either.
			for _, sub := range [][]string{{"jobs", "--jobs", "jobs"}, {"doctor"}, {"verify", "--duration", "1s"}} {
				r := run(t, "", append(sub, "--uri", c.uri, "--timeout", "2s")...)
				if strings.Contains(r.stdout+r.stderr, pw) {
					t.Fatalf("%v printed the password:\n%s%s", sub, r.stdout, r.stderr)
				}
				if c.name == "wrong password" && r.code != 2 {
					t.Logf("not testable here: the %s backend accepted a user it does not know (no authentication): %v exited %d",
						db.Server.Backend, sub, r.code)
					return
				}
				wantCode(t, r, 2)
				if !strings.Contains(r.stderr, "to fix: ") || !strings.Contains(r.stderr, c.fix) || !strings.Contains(r.stderr, "nothing was changed") {
					t.Errorf("%v: the error does not say %q and that nothing was changed:\n%s", sub, c.fix, r.stderr)
				}
				if r.took > c.maxTook {
					t.Errorf("%v took %v, more than %v", sub, r.took, c.maxTook)
				}
			}
		})
	}
	names, err := db.ListCollectionNames(context.Background(), map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) > 0 {
		t.Errorf("the failed runs created %v", names)
	}
}

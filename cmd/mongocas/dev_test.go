package main_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/mongotest"
)

// envWithout returns this process's environment without the variables
// named.
func envWithout(names ...string) []string {
	var env []string
	for _, e := range os.Environ() {
		name, _, _ := strings.Cut(e, "=")
		if !strings.Contains(" "+strings.Join(names, " ")+" ", " "+name+" ") {
			env = append(env, e)
		}
	}
	return env
}

// TestDevServesUntilInterrupted: `mongocas dev` with no MONGODB_URI starts
// a server, prints its URI and an export line; a client writes and reads
// there and the other subcommands work against it with that URI alone; on
// SIGINT it exits 0, the server stops answering and its data directory and
// process are gone.
func TestDevServesUntilInterrupted(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("sends SIGINT, which Windows cannot send to another process")
	}
	bin := binary(t)
	cmd := exec.CommandContext(t.Context(), bin, "dev") // killed if the test ends before the signal
	cmd.Env = envWithout(mongotest.EnvURI, mongotest.EnvBackend)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	got := map[string]string{}
	var printed []string
	deadline := time.After(5 * time.Minute) // a first build of the embedded server
	for got["Ctrl-C"] == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				_ = cmd.Wait()
				t.Fatalf("dev stopped before it was ready; stdout:\n%s\nstderr:\n%s", strings.Join(printed, "\n"), errb.String())
			}
			printed = append(printed, l)
			for _, p := range []string{"server: ", "uri: ", "data: ", "export MONGODB_URI=", "Ctrl-C"} {
				if strings.HasPrefix(l, p) {
					got[p] = l
				}
			}
		case <-deadline:
			t.Fatalf("no URI within 5 minutes; stdout:\n%s\nstderr:\n%s", strings.Join(printed, "\n"), errb.String())
		}
	}
	t.Logf("mongocas dev printed:\n%s", strings.Join(printed, "\n"))
	uri := strings.TrimPrefix(got["uri: "], "uri: ")
	if uri == "" {
		t.Fatalf("no uri line")
	}
	if want := "export MONGODB_URI='" + uri + "'"; got["export MONGODB_URI="] != want {
		t.Errorf("export line %q, want %q", got["export MONGODB_URI="], want)
	}
	u, err := url.Parse(uri)
	if err != nil || u.Path != "/dev" {
		t.Fatalf("uri %q does not name the database dev: %v", uri, err)
	}
	embedded := strings.Contains(got["server: "], "embedded")
	dataDir := ""
	if embedded {
		dataDir, _, _ = strings.Cut(strings.TrimPrefix(got["data: "], "data: "), " (")
		if st, err := os.Stat(dataDir); err != nil || !st.IsDir() {
			t.Fatalf("data directory %q of the embedded server: %v", dataDir, err)
		}
	}

	// A client writes and reads on the printed URI.
	ctx := t.Context()
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	coll := client.Database("dev").Collection("notes")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "n1"}, {Key: "text", Value: "hello"}}); err != nil {
		t.Fatal(err)
	}
	var note struct {
		Text string `bson:"text"`
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "n1"}}).Decode(&note); err != nil || note.Text != "hello" {
		t.Fatalf("read back %+v, %v", note, err)
	}

	// The other subcommands need nothing but MONGODB_URI set to the URI.
	doctor := exec.CommandContext(ctx, bin, "doctor", "--jobs", "jobs", "--fix")
	doctor.Env = append(envWithout(mongotest.EnvURI), mongotest.EnvURI+"="+uri)
	if out, err := doctor.CombinedOutput(); err != nil {
		t.Errorf("doctor --fix against dev's URI: %v\n%s", err, out)
	}

	// Ctrl-C: exit 0, the server and its data gone.
	host := u.Host
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("dev after SIGINT: %v, want exit status 0\nstderr:\n%s", err, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("dev still running 30s after SIGINT\nstderr:\n%s", errb.String())
	}
	d := net.Dialer{Timeout: time.Second}
	if c, err := d.DialContext(t.Context(), "tcp", host); err == nil {
		_ = c.Close()
		t.Errorf("something still listens at %s after dev stopped", host)
	}
	if embedded {
		if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("data directory %s after dev stopped: %v, want it removed", dataDir, err)
		}
		if pids := processesMentioning(t, dataDir); len(pids) > 0 {
			t.Errorf("processes %v still run with %s after dev stopped", pids, dataDir)
		}
	}
	if !strings.Contains(errb.String(), "mongocas dev: stopped") {
		t.Errorf("stderr does not say it stopped:\n%s", errb.String())
	}
}

// processesMentioning returns the ids of the processes whose command line
// contains s (Linux; none elsewhere).
func processesMentioning(t *testing.T, s string) []string {
	t.Helper()
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []string
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, filepath.Base(filepath.Dir(p)))
		}
	}
	return pids
}

// TestDevUsesMONGODB_URI: with MONGODB_URI set, as for mongotest, dev
// starts nothing, says so and exits 0 (TestDevReport: without printing the
// URI's password).
func TestDevUsesMONGODB_URI(t *testing.T) {
	db := mongotest.New(t)
	bin := binary(t)
	cmd := exec.CommandContext(t.Context(), bin, "dev")
	cmd.Env = append(envWithout(mongotest.EnvURI, mongotest.EnvBackend), mongotest.EnvURI+"="+db.Server.URI)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dev with MONGODB_URI set: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "nothing started") {
		t.Errorf("dev with MONGODB_URI set printed:\n%s", out)
	}

}

// TestDevRejectsABadDatabaseName: a bad --db is a usage error (exit 2)
// before any server starts.
func TestDevRejectsABadDatabaseName(t *testing.T) {
	r := run(t, "", "dev", "--db", "a.b")
	wantCode(t, r, 2)
	if !strings.Contains(r.stderr, "--db") || strings.Contains(r.stderr, "starting") {
		t.Errorf("stderr:\n%s", r.stderr)
	}
}

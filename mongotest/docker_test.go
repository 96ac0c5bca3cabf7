package mongotest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// captureNotices sends mongotest's notices to a buffer for the rest of t,
// which must not be parallel.
func captureNotices(t *testing.T) *syncBuffer {
	t.Helper()
	noticeOnce.Do(func() { noticeW = noticeWriter() })
	var b syncBuffer
	noticeMu.Lock()
	saved := noticeW
	noticeW = &b
	noticeMu.Unlock()
	t.Cleanup(func() {
		noticeMu.Lock()
		noticeW = saved
		noticeMu.Unlock()
	})
	return &b
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// fakeEngine is the part of the Docker Engine API the Docker backend uses,
// on a unix socket, recording the requests it gets.
type fakeEngine struct {
	mu       sync.Mutex
	requests []string
	created  createdContainer
	hasImage bool
	pullErr  string
	list     []map[string]any
}

// createdContainer is the part of a create request the test checks.
type createdContainer struct {
	HostConfig struct {
		AutoRemove   bool `json:"AutoRemove"`
		PortBindings map[string][]struct {
			HostIP string `json:"HostIp"`
		} `json:"PortBindings"`
	} `json:"HostConfig"`
	Labels map[string]string `json:"Labels"`
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path)
	switch {
	case r.URL.Path == "/_ping":
		_, _ = w.Write([]byte("OK"))
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/images/"):
		if !f.hasImage {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"message":"No such image: mongo:7.0"}`))
			return
		}
		_, _ = w.Write([]byte(`{}`))
	case r.URL.Path == "/images/create":
		if r.URL.Query().Get("fromImage") != "mongo" || r.URL.Query().Get("tag") != "7.0" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte(`{"status":"Pulling from library/mongo"}` + "\n"))
		if f.pullErr != "" {
			_, _ = fmt.Fprintf(w, `{"error":%q}`+"\n", f.pullErr)
			return
		}
		_, _ = w.Write([]byte(`{"status":"Downloaded newer image for mongo:7.0"}` + "\n"))
		f.hasImage = true
	case r.URL.Path == "/containers/json":
		if err := json.NewEncoder(w).Encode(f.list); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	case r.URL.Path == "/containers/create":
		_ = json.NewDecoder(r.Body).Decode(&f.created)
		_, _ = w.Write([]byte(`{"Id":"c1"}`))
	case r.URL.Path == "/containers/c1/start":
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == "/containers/c1/json":
		_, _ = w.Write([]byte(`{"NetworkSettings":{"Ports":{"27017/tcp":[{"HostIp":"127.0.0.1","HostPort":"40017"}]}}}`))
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func (f *fakeEngine) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// serveFakeEngine serves f on a socket and points DOCKER_HOST at it.
func serveFakeEngine(t *testing.T, f *fakeEngine) {
	t.Helper()
	dir, err := os.MkdirTemp("", "dk") //nolint:usetesting // short: a socket path has a length limit, which t.TempDir's test-named path can pass
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "d.sock")
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "unix", sock)
	require.NoError(t, err)
	srv := &http.Server{Handler: f} //nolint:gosec // a test server on a private socket
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	t.Setenv("DOCKER_HOST", "unix://"+sock)
}

// TestDockerEngineLifecycle: without testcontainers, the Docker backend
// pulls a missing image, removes the containers left by dead test processes
// of this machine (only those), starts its container with the port
// published on loopback and labelled with its owner, and removes it.
func TestDockerEngineLifecycle(t *testing.T) {
	exited := exec.CommandContext(context.Background(), os.Args[0], "-test.run=^$") //nolint:gosec // this test binary
	require.NoError(t, exited.Run())
	host, _ := os.Hostname()
	f := &fakeEngine{list: []map[string]any{
		{"Id": "dead", "Labels": map[string]string{ownerLabel: host + "/" + strconv.Itoa(exited.Process.Pid)}},
		{"Id": "alive", "Labels": map[string]string{ownerLabel: host + "/" + strconv.Itoa(os.Getpid())}},
		{"Id": "elsewhere", "Labels": map[string]string{ownerLabel: "another-host/" + strconv.Itoa(exited.Process.Pid)}},
	}}
	serveFakeEngine(t, f)
	notes := captureNotices(t)
	ctx := context.Background()
	require.True(t, dockerAnswers(ctx))

	e, err := newDockerEngine()
	require.NoError(t, err)
	e.reap(ctx)
	require.NoError(t, e.pull(ctx, "mongo:7.0"))
	addr, remove, err := e.run(ctx, "mongo:7.0", []string{"mongod", "--replSet", "rs0"}, "27017/tcp")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:40017", addr)
	remove()
	require.NoError(t, e.pull(ctx, "mongo:7.0")) // now present: no pull

	require.Equal(t, []string{
		"GET /_ping",
		"GET /containers/json",
		"DELETE /containers/dead",
		"GET /images/mongo:7.0/json",
		"POST /images/create",
		"POST /containers/create",
		"POST /containers/c1/start",
		"GET /containers/c1/json",
		"DELETE /containers/c1",
		"GET /images/mongo:7.0/json",
	}, f.got())
	require.Contains(t, notes.String(), "mongotest: pulling the Docker image mongo:7.0 (once)\nmongotest: pulled mongo:7.0 in")
	hc := f.created.HostConfig
	require.True(t, hc.AutoRemove)
	require.Len(t, hc.PortBindings["27017/tcp"], 1)
	require.Equal(t, "127.0.0.1", hc.PortBindings["27017/tcp"][0].HostIP)
	require.Equal(t, owner(), f.created.Labels[ownerLabel])
}

func TestDockerPullFailureSaysWhy(t *testing.T) {
	f := &fakeEngine{pullErr: "manifest for mongo:7.0 not found"}
	serveFakeEngine(t, f)
	captureNotices(t)
	e, err := newDockerEngine()
	require.NoError(t, err)
	err = e.pull(context.Background(), "mongo:7.0")
	require.ErrorContains(t, err, "pull mongo:7.0: manifest for mongo:7.0 not found")
}

func TestSplitImage(t *testing.T) {
	for img, want := range map[string][2]string{
		"mongo:7.0":                       {"mongo", "7.0"},
		"mongo":                           {"mongo", "latest"},
		"registry.local:5000/mongo":       {"registry.local:5000/mongo", "latest"},
		"registry.local:5000/mongo:8.0":   {"registry.local:5000/mongo", "8.0"},
		"mongo@sha256:0123456789abcdef00": {"mongo@sha256:0123456789abcdef00", ""},
	} {
		name, tag := splitImage(img)
		require.Equal(t, want, [2]string{name, tag}, img)
	}
}

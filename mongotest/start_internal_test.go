package mongotest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/store"
)

func TestStartMalformedURINamesItRedacted(t *testing.T) {
	t.Setenv(EnvBackend, "")
	t.Setenv(EnvURI, "mongodb://admin:topsecret@db.example:notaport/")
	began := time.Now()
	_, err := start(context.Background())
	require.ErrorIs(t, err, store.ErrConnect)
	require.Contains(t, err.Error(), "db.example")
	require.NotContains(t, err.Error(), "topsecret")
	require.Less(t, time.Since(began), time.Second)
}

func TestStartUnreachableURIFailsInBoundedTime(t *testing.T) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	t.Setenv(EnvBackend, "")
	t.Setenv(EnvURI, "mongodb://u:pw123@"+addr+"/?serverSelectionTimeoutMS=500&connectTimeoutMS=500")
	began := time.Now()
	_, err = start(context.Background())
	took := time.Since(began)
	require.ErrorIs(t, err, store.ErrConnect)
	require.Contains(t, err.Error(), addr)
	require.NotContains(t, err.Error(), "pw123")
	require.Less(t, took, 5*time.Second)
}

func TestStartRejectsUnknownBackend(t *testing.T) {
	t.Setenv(EnvBackend, "sqlite")
	_, err := start(context.Background())
	require.ErrorContains(t, err, "want uri, docker or embedded")

	t.Setenv(EnvBackend, "uri")
	t.Setenv(EnvURI, "")
	_, err = start(context.Background())
	require.ErrorContains(t, err, EnvURI+" is empty")
}

func TestEmbeddedModeIsValidated(t *testing.T) {
	t.Setenv(EnvEmbedded, "thread")
	_, err := startEmbedded(context.Background())
	require.ErrorContains(t, err, "want process, or unset it")
	t.Setenv(EnvEmbedded, "inprocess")
	_, err = startEmbedded(context.Background())
	require.ErrorContains(t, err, "stays out of your module graph")
}

func TestEmbeddedStartFailureIsAClearError(t *testing.T) {
	// FerretDB refuses a data directory that does not exist: a clear error,
	// no server.
	addr, stop, how, err := launchFerretDB(context.Background(), "/nonexistent/mongocas")
	require.Error(t, err)
	require.Empty(t, addr)
	require.Nil(t, stop)
	t.Logf("start-up failure (%s) reads: %v", how, err)
	// FerretDB's debug builds panic in a finalizer if a failed start leaked
	// its backend: collect now so such a leak fails this test.
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
}

func TestLockHeldByALiveProcessIsNeverStale(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")

	// Ours: alive, however old the file.
	require.NoError(t, os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600))
	old := time.Now().Add(-24 * time.Hour)
	require.NoError(t, os.Chtimes(path, old, old))
	holder, stale := lockState(path)
	require.False(t, stale)
	require.Equal(t, "process "+strconv.Itoa(os.Getpid()), holder)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	waited := ""
	_, err := lockFile(ctx, path, func(h string) { waited = h })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, holder, waited)

	// A process that has exited: stale at once, however young the file.
	cmd := exec.CommandContext(context.Background(), os.Args[0], "-test.run=^$") //nolint:gosec // this test binary
	require.NoError(t, cmd.Run())
	require.NoError(t, os.WriteFile(path, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)) //nolint:gosec // a path under t.TempDir
	_, stale = lockState(path)
	require.True(t, stale)
	unlock, err := lockFile(context.Background(), path, nil)
	require.NoError(t, err)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid())+"\n", string(b))
	unlock()
	require.NoFileExists(t, path)

	// No pid to check: stale only after staleLockAge.
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	_, stale = lockState(path)
	require.False(t, stale)
	old = time.Now().Add(-staleLockAge - time.Minute)
	require.NoError(t, os.Chtimes(path, old, old))
	_, stale = lockState(path)
	require.True(t, stale)
}

func TestServerKeyFollowsTheSources(t *testing.T) {
	src, err := findServerSource(ferretdbServer)
	require.NoError(t, err)
	require.NotEmpty(t, src.dir, "in this repository the server is built from the sources beside mongotest")
	require.FileExists(t, filepath.Join(src.dir, "go.mod"))
	k1, err := src.key()
	require.NoError(t, err)
	k2, err := src.key()
	require.NoError(t, err)
	require.Equal(t, k1, k2)
	require.Len(t, k1, 16)

	// Editing a source file changes the hash.
	dir := t.TempDir()
	local := serverSource{dir: dir}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n"), 0o600))
	before, err := local.key()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main // edited\n"), 0o600))
	after, err := local.key()
	require.NoError(t, err)
	require.NotEqual(t, before, after)

	// A published version is keyed by its name alone.
	a, err := serverSource{module: serverModule, version: "v1.2.3"}.key()
	require.NoError(t, err)
	b, err := serverSource{module: serverModule, version: "v1.2.4"}.key()
	require.NoError(t, err)
	require.NotEqual(t, a, b)

	// The version override takes the published path.
	t.Setenv(EnvServerVersion, "v9.9.9")
	src, err = findServerSource(ferretdbServer)
	require.NoError(t, err)
	require.Equal(t, serverSource{module: serverModule, version: "v9.9.9"}, src)
}

func TestPublishedServerFollowsMongotestsVersion(t *testing.T) {
	info := func(m debug.Module) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Path: "example.com/user"}, Deps: []*debug.Module{
			{Path: "github.com/mongocas/mongocas", Version: "v1.0.0"}, &m,
		}}
	}
	for _, c := range []struct {
		m    debug.Module
		want string // module@version, or "" for an error
	}{
		{debug.Module{Path: mongotestModule, Version: "v1.4.0"}, serverModule + "@v1.4.0"},
		{debug.Module{Path: mongotestModule, Version: "v0.0.0-20260101120000-0123456789ab"}, serverModule + "@0123456789ab"},
		{debug.Module{Path: mongotestModule, Version: "v1.4.1-0.20260101120000-0123456789ab"}, serverModule + "@0123456789ab"},
		{debug.Module{Path: mongotestModule, Version: "v1.5.0-rc.1.0.20260101120000-0123456789ab"}, serverModule + "@0123456789ab"},
		{debug.Module{Path: mongotestModule, Version: "v1.4.0", Replace: &debug.Module{Path: "example.com/fork/mongotest", Version: "v1.4.0-fork"}},
			"example.com/fork/mongotest/ferretdbserver@v1.4.0-fork"},
		{debug.Module{Path: mongotestModule, Version: "v1.4.0", Replace: &debug.Module{Path: "../mongotest"}}, ""},
		{debug.Module{Path: "example.com/other", Version: "v1.0.0"}, ""},
	} {
		src, err := publishedServer(info(c.m), ferretdbServer)
		if c.want == "" {
			require.Error(t, err, "%+v", c.m)
			require.ErrorContains(t, err, EnvServerVersion)
			continue
		}
		require.NoError(t, err, "%+v", c.m)
		require.Equal(t, c.want, src.String())
	}
}

func TestPruneKeepsTheNewestBinaries(t *testing.T) {
	dir := t.TempDir()
	touch := func(name string, age time.Duration) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte("x"), 0o600))
		when := time.Now().Add(-age)
		require.NoError(t, os.Chtimes(p, when, when))
		return p
	}
	bins := make([]string, 0, 6)
	for i := range 6 {
		bins = append(bins, touch(fmt.Sprintf("%s%016x", ferretdbServer.binPrefix(), i), time.Duration(i)*time.Hour))
	}
	// The oldest is being built again by someone: its lock keeps it.
	touch(filepath.Base(bins[5])+".lock", 0)
	others := []string{
		touch(lastBuildFile(ferretdbServer), 10*time.Hour),
		touch(mongodbServer.binPrefix()+"0000000000000000", 10*time.Hour), // another command's
		touch(filepath.Base(bins[4])+".tmp-123", 10*time.Hour),
		touch("ferretdbserver-plan9-arm-0000000000000000", 10*time.Hour),
		touch("notes.txt", 10*time.Hour),
	}
	removed, err := prune(dir, ferretdbServer.binPrefix(), keepBinaries, "")
	require.NoError(t, err)
	require.ElementsMatch(t, bins[3:5], removed)
	for _, p := range append(append(others, bins[:3]...), bins[5]) {
		require.FileExists(t, p)
	}
	for _, p := range removed {
		require.NoFileExists(t, p)
	}
}

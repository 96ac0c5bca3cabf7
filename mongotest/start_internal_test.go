package mongotest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

func TestDockerAbsentIsFoundQuickly(t *testing.T) {
	// A socket path where nothing listens, and a TCP port that accepts but
	// never answers: both must be given up on within the two-second bound.
	t.Setenv("DOCKER_HOST", "unix://"+t.TempDir()+"/docker.sock")
	began := time.Now()
	require.False(t, dockerAnswers(context.Background()))
	require.Less(t, time.Since(began), 100*time.Millisecond)

	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // hold it open, say nothing
		}
	}()
	t.Setenv("DOCKER_HOST", "tcp://"+ln.Addr().String())
	began = time.Now()
	require.False(t, dockerAnswers(context.Background()))
	require.Less(t, time.Since(began), 3*time.Second)
}

func TestEmbeddedModeIsValidated(t *testing.T) {
	t.Setenv(EnvEmbedded, "thread")
	_, err := startEmbedded(context.Background())
	require.ErrorContains(t, err, "want process or inprocess")
}

func TestEmbeddedStartFailureIsAClearError(t *testing.T) {
	// FerretDB refuses a data directory that does not exist, in-process or
	// in its child process: either way a clear error, no server.
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

func TestChildKeyFollowsTheSources(t *testing.T) {
	goBin, err := goCommand()
	require.NoError(t, err)
	ctx := context.Background()
	k1, err := childKey(ctx, goBin)
	require.NoError(t, err)
	k2, err := childKey(ctx, goBin)
	require.NoError(t, err)
	require.Equal(t, k1, k2)
	require.Len(t, k1, 16)

	// Editing a source file changes the hash.
	dir := t.TempDir()
	sum := func() string {
		h := sha256.New()
		require.NoError(t, hashSources(h, dir))
		return hex.EncodeToString(h.Sum(nil))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n"), 0o600))
	before := sum()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main // edited\n"), 0o600))
	require.NotEqual(t, before, sum())
}

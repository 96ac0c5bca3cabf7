package mongotest

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDockerImageFollowsTheVersionVariable(t *testing.T) {
	t.Setenv(EnvDockerImage, "")
	for v, want := range map[string]string{"": "mongo:7.0", "6.0": "mongo:6.0", "8.0": "mongo:8.0", "7.0.14": "mongo:7.0.14"} {
		t.Setenv(EnvMongoDBVersion, v)
		img, err := dockerImage()
		require.NoError(t, err, v)
		require.Equal(t, want, img, v)
	}
	for _, bad := range []string{"latest", "7", "7.0; rm", "mongo:7.0"} {
		t.Setenv(EnvMongoDBVersion, bad)
		_, err := dockerImage()
		require.ErrorIs(t, err, errBadSetting, bad)
		require.ErrorContains(t, err, EnvMongoDBVersion, bad)
		require.ErrorContains(t, err, "6.0, 7.0 or 8.0", bad)
	}
	// The image variable, a mirror's for instance, names the image itself.
	t.Setenv(EnvDockerImage, "mirror.example.com/mongo:8.0")
	img, err := dockerImage()
	require.NoError(t, err)
	require.Equal(t, "mirror.example.com/mongo:8.0", img)
}

func TestDockerChildLinesAreParsed(t *testing.T) {
	t.Parallel()
	uri, err := parseDockerLine("URI mongodb://127.0.0.1:32768/?directConnection=true")
	require.NoError(t, err)
	require.Equal(t, "mongodb://127.0.0.1:32768/?directConnection=true", uri)

	_, err = parseDockerLine(`NODOCKER check host "unix:///var/run/docker.sock": connect: no such file or directory `)
	var nd *noDockerError
	require.ErrorAs(t, err, &nd)
	require.Equal(t, `check host "unix:///var/run/docker.sock": connect: no such file or directory`, nd.reason)
	require.ErrorContains(t, err, "no Docker engine answered: check host")

	for _, bad := range []string{"", "LISTEN 127.0.0.1:1", "URI http://x:1/", "URI mongodb://", "URI", "mongodb://127.0.0.1:1/"} {
		_, err := parseDockerLine(bad)
		require.Error(t, err, bad)
		require.NotErrorAs(t, err, &nd, "%q is not a NODOCKER line", bad)
	}
}

// listenUnix listens on a fresh unix socket that accepts connections and
// closes them at once, as a socket with something behind it that is not a
// Docker engine, and returns its path.
func listenUnix(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "docker.sock")
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return path
}

func TestDockerIsLookedForWithoutItsAPI(t *testing.T) {
	t.Setenv("HOME", t.TempDir()) // no ~/.testcontainers.properties
	// A socket nobody listens on: not there, and said why, at once.
	missing := "unix://" + t.TempDir() + "/docker.sock"
	t.Setenv("DOCKER_HOST", missing)
	began := time.Now()
	p, why, ok := findDocker(context.Background())
	require.False(t, ok)
	require.Less(t, time.Since(began), dockerDialTimeout, "refused at once, not timed out")
	require.Equal(t, "DOCKER_HOST="+missing, p.where)
	require.Contains(t, why, "DOCKER_HOST="+missing)
	require.Contains(t, why, "docker.sock")

	// A socket that accepts: there, as far as mongotest can tell without
	// the API; the child asks the engine.
	sock := listenUnix(t)
	t.Setenv("DOCKER_HOST", "unix://"+sock)
	p, why, ok = findDocker(context.Background())
	require.True(t, ok, why)
	require.Equal(t, "DOCKER_HOST=unix://"+sock, p.where)
	require.Empty(t, p.env, "DOCKER_HOST reaches the child as it is")

	// Unset: the default sockets, the rootless one among them.
	t.Setenv("DOCKER_HOST", "")
	t.Setenv("XDG_RUNTIME_DIR", filepath.Dir(sock))
	p, why, ok = findDocker(context.Background())
	if ok && p.where == "unix:///var/run/docker.sock" {
		t.Skip("this machine has a Docker socket at /var/run/docker.sock")
	}
	require.True(t, ok, why)
	require.Equal(t, "unix://"+sock, p.where)
	require.Equal(t, []string{"DOCKER_HOST=unix://" + sock}, p.env, "the child is told where")
}

// TestNoDockerFallsBackToEmbeddedSayingWhy: with no engine behind the socket
// it found, the Docker backend's child (built from mongotest/mongodbserver,
// testcontainers-go inside) says NODOCKER, and Start gives the embedded
// server, whose line says why not Docker. Forced to Docker, the same is an
// error that says so. Where nothing listens, the child is not even built.
func TestNoDockerFallsBackToEmbeddedSayingWhy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the Docker backend's child (-short)")
	}
	t.Setenv(EnvURI, "")
	t.Setenv(EnvBackend, "")
	sock := listenUnix(t)
	t.Setenv("DOCKER_HOST", "unix://"+sock)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute) // a cold build of the child on a busy machine
	defer cancel()
	s, err := start(ctx)
	require.NoError(t, err)
	defer s.stop()
	require.Equal(t, BackendEmbedded, s.Backend)
	line := s.describe()
	t.Logf("the backend line: %s", line)
	require.Contains(t, line, "the embedded server")
	require.Contains(t, line, "; not Docker: no Docker engine answered: DOCKER_HOST=unix://"+sock+": ")
	require.Equal(t, 1, strings.Count(line, "\n")+1, "one line")

	t.Setenv(EnvBackend, "docker")
	_, err = start(ctx)
	require.ErrorIs(t, err, errDockerBackend)
	require.ErrorContains(t, err, "no Docker engine answered: DOCKER_HOST=unix://"+sock)
	require.ErrorContains(t, err, "To fix: start Docker")

	t.Setenv(EnvBackend, "")
	t.Setenv("DOCKER_HOST", "unix://"+t.TempDir()+"/docker.sock")
	s2, err := start(ctx)
	require.NoError(t, err)
	defer s2.stop()
	require.Contains(t, s2.describe(), "; not Docker: DOCKER_HOST=unix://")
	require.Contains(t, s2.describe(), "docker.sock: dial unix")
}

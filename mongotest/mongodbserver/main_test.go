package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// asMain makes this test binary, run again by runMain, be the command.
const asMain = "MONGODBSERVER_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// runMain runs the command (this test binary, as main) with args and env,
// and returns its standard output and error and its exit status.
func runMain(t *testing.T, env []string, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...) //nolint:gosec // this test binary
	cmd.Env = append(append(os.Environ(), asMain+"=1"), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &out, &errOut, strings.NewReader("")
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		status = ee.ExitCode()
	default:
		t.Fatal(err)
	}
	return out.String(), errOut.String(), status
}

func TestFlagsAreCheckedBeforeAnythingStarts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string // "" means valid
	}{
		{[]string{"-image", "mongo:7.0"}, ""},
		{[]string{"-image", "mongo:8.0", "-replset", "rs_1", "-timeout", "90s"}, ""},
		{[]string{"-image", "registry.example.com:5000/team/mongo:6.0.19"}, ""},
		{[]string{"-image", "mongo@sha256:" + strings.Repeat("ab", 32)}, ""},
		{nil, "-image is required"},
		{[]string{"-image", "mongo 7"}, "is not an image reference"},
		{[]string{"-image", "mongo:7.0;rm"}, "is not an image reference"},
		{[]string{"-image", "mongo:7.0", "-replset", "rs 0"}, "-replset"},
		{[]string{"-image", "mongo:7.0", "-replset", ""}, "-replset"},
		{[]string{"-image", "mongo:7.0", "-timeout", "0s"}, "-timeout"},
		{[]string{"-image", "mongo:7.0", "extra"}, "unexpected arguments"},
		{[]string{"-port", "1"}, "flag provided but not defined"},
	}
	for _, c := range cases {
		cfg, err := parseFlags(c.args, io.Discard)
		if c.want == "" {
			if err != nil {
				t.Errorf("%q: %v", c.args, err)
			} else if cfg.image == "" || cfg.replSet == "" || cfg.timeout <= 0 {
				t.Errorf("%q: incomplete config %+v", c.args, cfg)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.args, err, c.want)
		}
	}
	cfg, err := parseFlags([]string{"-image", "mongo:7.0"}, io.Discard)
	if err != nil || cfg.replSet != "rs0" || cfg.timeout != 3*time.Minute {
		t.Errorf("defaults: %+v, %v; want rs0 and 3m", cfg, err)
	}
}

func TestBadFlagsExitWithStatus2AndNoOutput(t *testing.T) {
	t.Parallel()
	stdout, stderr, status := runMain(t, nil, "-image", "not an image")
	if status != exitUsage || stdout != "" || !strings.Contains(stderr, "mongodbserver: -image") {
		t.Fatalf("status %d, stdout %q, stderr %q; want %d, nothing, the reason", status, stdout, stderr, exitUsage)
	}
}

func TestConnectionStringIsMadeDirect(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"mongodb://localhost:32768/?replicaSet=rs0":           "mongodb://localhost:32768/?directConnection=true",
		"mongodb://127.0.0.1:32768":                           "mongodb://127.0.0.1:32768/?directConnection=true",
		"mongodb://u:p@127.0.0.1:1/?replicaSet=rs&w=majority": "mongodb://u:p@127.0.0.1:1/?directConnection=true&w=majority",
	}
	for in, want := range cases {
		got, err := directURI(in)
		if err != nil || got != want {
			t.Errorf("directURI(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"mongodb+srv://cluster.example.com/", "mongodb://a:1,b:2/", "http://x:1/", "://"} {
		if got, err := directURI(bad); err == nil {
			t.Errorf("directURI(%q) = %q, want an error", bad, got)
		}
	}
}

func TestNoDockerLineIsOneLine(t *testing.T) {
	t.Parallel()
	got := noDockerLine(errors.New("check host:\n  docker info:\tfailed  "))
	if got != "NODOCKER check host: docker info: failed" {
		t.Fatalf("%q", got)
	}
}

// TestNoEngineIsReportedAsNODOCKER: where no Docker engine answers (a socket
// nobody listens on, a TCP port that accepts and never answers), the command
// prints one NODOCKER line, exits with status 3, and does so within its
// bound, so that mongotest can fall back to its embedded server.
func TestNoEngineIsReportedAsNODOCKER(t *testing.T) {
	t.Parallel()
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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
	for _, host := range []string{"unix://" + t.TempDir() + "/docker.sock", "tcp://" + ln.Addr().String()} {
		began := time.Now()
		stdout, stderr, status := runMain(t, []string{"DOCKER_HOST=" + host}, "-image", "mongo:7.0")
		took := time.Since(began)
		if status != exitNoDocker || !strings.HasPrefix(stdout, "NODOCKER ") || strings.Count(stdout, "\n") != 1 {
			t.Errorf("DOCKER_HOST=%s: status %d, stdout %q, stderr %q; want %d and one NODOCKER line", host, status, stdout, stderr, exitNoDocker)
		}
		if took > healthTimeout+5*time.Second {
			t.Errorf("DOCKER_HOST=%s: took %v, more than the %v bound", host, took, healthTimeout)
		}
		t.Logf("DOCKER_HOST=%s (%v): %s", host, took.Round(time.Millisecond), strings.TrimSpace(stdout))
	}
}

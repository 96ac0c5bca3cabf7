package mongotest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// buildEnv makes this test binary, run again by TestBuildSaysWhatItDoes,
// build (or find) the server and print "BIN path" instead of running tests;
// its notices go to standard error, every 300 ms while it builds.
const buildEnv = "MONGOTEST_TEST_BUILD"

func init() { //nolint:gochecknoinits // the re-run binary must build and exit before TestMain, in the external test package, starts a server
	if os.Getenv(buildEnv) == "" {
		return
	}
	progressEvery = 300 * time.Millisecond
	noticeOnce.Do(func() {}) // notices to standard error, where the test reads them
	bin, err := buildChild(context.Background(), ferretdbServer)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ERROR", err)
		os.Exit(1)
	}
	fmt.Println("BIN", bin)
	os.Exit(0)
}

// line is a line of a child's output and when it came.
type line struct {
	at   time.Duration
	text string
}

// runBuild runs this binary as a builder with its cache in cache and returns
// its notices (stderr), with when each came, and the binary it printed.
func runBuild(t *testing.T, cache string) (notices []line, bin string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$") //nolint:gosec // this test binary
	// XDG_CACHE_HOME moves the go build cache too, unless GOCACHE is set:
	// keep the warm one.
	goCache, err := exec.CommandContext(ctx, "go", "env", "GOCACHE").Output()
	require.NoError(t, err)
	cmd.Env = append(os.Environ(), buildEnv+"=1", "XDG_CACHE_HOME="+cache, "GOCACHE="+strings.TrimSpace(string(goCache)))
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	var out strings.Builder
	cmd.Stdout = &out
	began := time.Now()
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		notices = append(notices, line{time.Since(began), sc.Text()})
	}
	require.NoError(t, cmd.Wait(), "notices: %v", notices)
	bin, ok := strings.CutPrefix(strings.TrimSpace(out.String()), "BIN ")
	require.True(t, ok, out.String())
	return notices, bin
}

// TestBuildSaysWhatItDoes builds the server for real, into a fresh cache
// directory (the go build cache makes it a matter of seconds once the
// sources are compiled): the first line comes at once and says what is
// built, a line follows at least every progress period, and the cache keeps
// the newest three binaries; a second start builds nothing and says
// nothing; a later build says how long the last one took.
func TestBuildSaysWhatItDoes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the server (-short)")
	}
	if runtime.GOOS != "linux" {
		t.Skip("XDG_CACHE_HOME moves the user cache directory on Linux only")
	}
	cache := t.TempDir()
	dir := filepath.Join(cache, "mongocas")
	require.NoError(t, os.MkdirAll(dir, 0o750))
	old := make([]string, 0, 3)
	for i := range 3 {
		p := filepath.Join(dir, fmt.Sprintf("%s%016x", ferretdbServer.binPrefix(), i))
		require.NoError(t, os.WriteFile(p, nil, 0o600))
		when := time.Now().Add(-time.Duration(i+1) * time.Hour)
		require.NoError(t, os.Chtimes(p, when, when))
		old = append(old, p)
	}

	notices, bin := runBuild(t, cache)
	t.Logf("cold build: %d lines in %s, the first after %s: %s", len(notices), notices[len(notices)-1].at.Round(time.Millisecond),
		notices[0].at.Round(time.Millisecond), notices[0].text)
	require.Equal(t, dir, filepath.Dir(bin))
	require.FileExists(t, bin)
	require.NotEmpty(t, notices)
	require.Less(t, notices[0].at, 5*time.Second, "the first line must come at once")
	require.Contains(t, notices[0].text, "mongotest: building the embedded MongoDB-wire server (FerretDB v1, "+serverModule+")")
	require.Contains(t, notices[0].text, "no build recorded here yet")
	require.Contains(t, notices[0].text, "about 650 MB of modules", "the first line says what a first build downloads")
	gomodcache, err := exec.CommandContext(t.Context(), "go", "env", "GOMODCACHE").Output()
	require.NoError(t, err)
	require.Contains(t, notices[0].text, "("+strings.TrimSpace(string(gomodcache))+")", "the first line says where the modules go")
	last := notices[len(notices)-2:]
	require.Contains(t, last[0].text, "mongotest: built the embedded server in ")
	require.Contains(t, last[1].text, "mongotest: removed 1 older server binaries")
	for i := 1; i < len(notices); i++ {
		require.Less(t, notices[i].at-notices[i-1].at, 10*progressEvery, "a gap in the progress lines: %v", notices)
	}
	if notices[len(notices)-2].at > 2*progressEvery {
		require.Contains(t, notices[1].text, "mongotest: still building the embedded server: ")
	}
	require.FileExists(t, filepath.Join(dir, lastBuildFile(ferretdbServer)))
	require.NoFileExists(t, old[2], "the oldest binary is pruned")
	require.FileExists(t, old[0])
	require.FileExists(t, old[1])

	notices, again := runBuild(t, cache)
	require.Equal(t, bin, again)
	require.Empty(t, notices, "a built server is used as it is, silently")

	require.NoError(t, os.Remove(bin))
	notices, _ = runBuild(t, cache)
	require.NotEmpty(t, notices)
	require.Contains(t, notices[0].text, "the last build here took ")
}

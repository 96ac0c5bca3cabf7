package mongotest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
)

// EnvEmbedded was how one chose to run FerretDB inside the test binary
// ("inprocess") or in a child process ("process"). It runs in a child process
// always now: linking FerretDB into mongotest would put FerretDB and the
// database drivers it links (SQLite, PostgreSQL, MySQL, SAP HANA) in the
// module graph of every module that uses mongotest. "process" is accepted;
// "inprocess" is an error that says so.
const EnvEmbedded = "MONGOCAS_EMBEDDED"

// EnvServerVersion names the variable that, when set, gives the version of
// the embedded server's module that mongotest builds with
// `go install module@version` (a tag, a pseudo-version or a commit), in place
// of the one it finds by itself (see serverSource).
const EnvServerVersion = "MONGOCAS_FERRETDBSERVER_VERSION"

// EnvMongoDBServerVersion is EnvServerVersion for the Docker backend's
// command, the module mongotest/mongodbserver.
const EnvMongoDBServerVersion = "MONGOCAS_MONGODBSERVER_VERSION"

// The module the embedded server is built from, a module of its own so that
// FerretDB never enters the user's module graph, and mongotest's own module
// path, whose version says which server version goes with it.
const (
	serverModule    = mongotestModule + "/ferretdbserver"
	mongotestModule = "github.com/mongocas/mongocas/mongotest"
)

// serverPackage is the command the child process is built from (the server
// module's root package).
const serverPackage = serverModule

// childCommand is a server command that mongotest builds, on first use, from
// a module of its own (so that what it links never enters the user's module
// graph) and runs as a child process.
type childCommand struct {
	// name is the module's directory under mongotest and the start of its
	// binaries' names.
	name string
	// what is what the build's notices call it; desc what the first one says
	// it is.
	what, desc string
	// envVersion names the variable that picks a published version.
	envVersion string
}

// The two commands: FerretDB for the embedded backend, and MongoDB through
// testcontainers-go for the Docker backend.
var (
	ferretdbServer = childCommand{
		name: "ferretdbserver", what: "the embedded server", envVersion: EnvServerVersion,
		desc: "the embedded MongoDB-wire server (FerretDB v1, " + serverModule + ")",
	}
	mongodbServer = childCommand{
		name: "mongodbserver", what: "the Docker backend's command", envVersion: EnvMongoDBServerVersion,
		desc: "the Docker backend's command (testcontainers-go's MongoDB module, " + mongotestModule + "/mongodbserver)",
	}
)

func (c childCommand) module() string { return mongotestModule + "/" + c.name }

// binPrefix starts the name of every binary of c in the cache directory.
func (c childCommand) binPrefix() string {
	return c.name + "-" + runtime.GOOS + "-" + runtime.GOARCH + "-"
}

// launchFerretDB starts FerretDB with its data in dir, in a child process,
// and returns its address, a stop function and how it runs.
func launchFerretDB(ctx context.Context, dir string) (addr string, stop func(), how string, err error) {
	switch mode := strings.ToLower(os.Getenv(EnvEmbedded)); mode {
	case "", "process":
	case "inprocess":
		return "", nil, "", tag(errBadSetting, fmt.Errorf("%s=inprocess is no longer available: FerretDB always runs in a child process, "+
			"so that it stays out of your module graph (its start costs about 15 ms more)", EnvEmbedded))
	default:
		return "", nil, "", tag(errBadSetting, fmt.Errorf("%s=%q: want process, or unset it", EnvEmbedded, mode))
	}
	line, stop, err := startChild(ctx, ferretdbServer, 30*time.Second, "-dir", dir)
	if err != nil {
		return "", nil, "", fmt.Errorf("FerretDB child process: %w", err)
	}
	addr, found := strings.CutPrefix(line, "LISTEN ")
	if !found {
		stop()
		return "", nil, "", fmt.Errorf("FerretDB child process: its first line is %q, not LISTEN host:port", line)
	}
	return addr, stop, "child process", nil
}

// goCommand finds the go command on PATH (go test puts its own toolchain's
// bin directory first there).
func goCommand() (string, error) { return exec.LookPath("go") }

// serverSource is where the server binary is built from: the sources beside
// mongotest's own (this repository, or a local replace of mongotest), or a
// published version of the server module.
type serverSource struct {
	// dir is the server module's directory, for a local build; empty for
	// a published one.
	dir string
	// module and version name the published module, for
	// `go install module@version`.
	module, version string
}

func (s serverSource) String() string {
	if s.dir != "" {
		return s.dir
	}
	return s.module + "@" + s.version
}

// findServerSource says where the command is built from.
//
//   - Its envVersion set: that version of its module, published.
//   - Its directory (ferretdbserver, mongodbserver) beside this file's source
//     holds its module (a checkout, a local replace of mongotest, go.work): those
//     sources, built in that directory with GOWORK=off, so that its own
//     go.mod and go.sum pin every module it links.
//   - Otherwise mongotest comes from the module cache, which does not hold
//     nested modules: the server module at mongotest's own version, read from
//     the build information of this binary (for a pseudo-version, its
//     commit). A release tags mongotest/vX.Y.Z and
//     mongotest/ferretdbserver/vX.Y.Z and mongotest/mongodbserver/vX.Y.Z at
//     the same commit.
func findServerSource(c childCommand) (serverSource, error) {
	if v := os.Getenv(c.envVersion); v != "" {
		return serverSource{module: c.module(), version: v}, nil
	}
	if dir, ok := localServerDir(c); ok {
		return serverSource{dir: dir, module: c.module()}, nil
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return serverSource{}, fmt.Errorf("this binary has no build information to tell which version of %s it links; set %s", mongotestModule, c.envVersion)
	}
	return publishedServer(bi, c)
}

// localServerDir returns the directory of c's module beside this file's
// source, if there is one. A build with -trimpath records no directory, and
// the module cache holds none.
func localServerDir(c childCommand) (string, bool) {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", false
	}
	dir := filepath.Join(filepath.Dir(file), c.name)
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", false
	}
	for line := range strings.Lines(string(b)) {
		if mod, found := strings.CutPrefix(strings.TrimSpace(line), "module "); found {
			return dir, strings.HasSuffix(strings.TrimSpace(mod), "/"+c.name)
		}
	}
	return "", false
}

// pseudoVersionRev matches the commit at the end of a pseudo-version.
var pseudoVersionRev = regexp.MustCompile(`[.-]\d{14}-([0-9a-f]{12})(\+incompatible)?$`)

// publishedServer returns c's module at the version of mongotest that bi
// links: the same version, or for a pseudo-version its commit (c's module's
// pseudo-version for that commit has another base version).
func publishedServer(bi *debug.BuildInfo, c childCommand) (serverSource, error) {
	var m *debug.Module
	if bi.Main.Path == mongotestModule {
		m = &bi.Main
	}
	for _, d := range bi.Deps {
		if d.Path == mongotestModule {
			m = d
		}
	}
	if m == nil {
		return serverSource{}, fmt.Errorf("the build information of this binary does not list %s; set %s", mongotestModule, c.envVersion)
	}
	path, version := m.Path, m.Version
	if m.Replace != nil {
		path, version = m.Replace.Path, m.Replace.Version
	}
	if version == "" || version == "(devel)" {
		return serverSource{}, fmt.Errorf("%s has no version here and no %s directory beside its sources; set %s", path, c.name, c.envVersion)
	}
	if sub := pseudoVersionRev.FindStringSubmatch(version); sub != nil {
		version = sub[1]
	}
	return serverSource{module: path + "/" + c.name, version: version}, nil
}

// key is a hash of everything the server binary is built from. For a local
// build: the server module's go.mod and go.sum (which pin every module it
// links, as it builds with GOWORK=off) and its files; for a published one,
// its module path and version. Both with this binary's Go version and
// platform. No go command runs.
func (s serverSource) key() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if s.dir == "" {
		fmt.Fprintf(h, "published %s@%s\n", s.module, s.version)
	} else if err := hashSources(h, s.dir); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// cacheDir is where built servers are kept: mongocas in the user cache
// directory.
func cacheDir() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "mongocas")
	return dir, os.MkdirAll(dir, 0o750)
}

// buildChild returns the path of c's binary for the source at hand, building
// it on first use.
//
// The binary lives in the user cache directory under a name keyed by what it
// is built from (see serverSource.key), so checkouts and versions of mongocas
// never run each other's binary, and one that exists is used as it is: no go
// command runs. A lock file keeps parallel test binaries from building the
// same file at once. While it builds, the builder says what it builds, how
// long the last build took, and every few seconds how long it has been going
// (see notice); after a build, it keeps the newest keepBinaries binaries and
// removes the rest.
func buildChild(ctx context.Context, c childCommand) (string, error) {
	src, err := findServerSource(c)
	if err != nil {
		return "", err
	}
	key, err := src.key()
	if err != nil {
		return "", err
	}
	dir, err := cacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, c.binPrefix()+key)
	if _, err := os.Stat(bin); err == nil {
		now := time.Now()
		_ = os.Chtimes(bin, now, now) // recently used: pruned last
		return bin, nil
	}
	unlock, err := lockFile(ctx, bin+".lock", func(holder string) {
		noticef("mongotest: waiting for %s to finish building %s into %s", holder, c.what, bin)
	})
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // built while we waited
	}
	if err := build(ctx, c, src, dir, bin); err != nil {
		return "", err
	}
	if removed, err := prune(dir, c.binPrefix(), keepBinaries, bin); err == nil && len(removed) > 0 {
		noticef("mongotest: removed %d older server binaries from %s (keeping the newest %d of %s)", len(removed), dir, keepBinaries, c.name)
	}
	return bin, nil
}

// build builds c from src into bin, saying what it does while it does (see
// progress), and records how long it took.
func build(ctx context.Context, c childCommand, src serverSource, dir, bin string) error {
	goBin, err := goCommand()
	if err != nil {
		return fmt.Errorf("no go command on PATH to build %s: %w", c.module(), err)
	}
	work, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	var cmd *exec.Cmd
	out := filepath.Join(work, c.name)
	if src.dir != "" {
		// In the module's own directory, without the workspace: its go.mod
		// and go.sum decide every version, as in the published build.
		cmd = exec.CommandContext(ctx, goBin, "build", "-o", out, ".")
		cmd.Dir = src.dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	} else {
		// Outside any module: go install module@version builds with the
		// module's own go.mod, whatever the user's module requires.
		cmd = exec.CommandContext(ctx, goBin, "install", src.module+"@"+src.version)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "GOBIN="+work)
	}
	if runtime.GOOS == "windows" {
		out += ".exe"
	}
	last, hasLast := readLastBuild(dir, c)
	p := startProgress(c, src, bin, goEnv(goBin, "GOMODCACHE"), last, hasLast)
	output, err := cmd.CombinedOutput()
	took := p.stop(err == nil)
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(output)))
	}
	if err := os.Rename(out, bin); err != nil {
		return err
	}
	writeLastBuild(dir, c, lastBuild{Seconds: took.Seconds(), Source: src.String(), At: time.Now().UTC()})
	return nil
}

// goEnv returns the go command's value for the variable name, or
// "$name" when the go command cannot say.
func goEnv(goBin, name string) string {
	out, err := exec.Command(goBin, "env", name).Output() //nolint:noctx // a few milliseconds, before the build
	if v := strings.TrimSpace(string(out)); err == nil && v != "" {
		return v
	}
	return "$" + name
}

// hashSources adds the name and contents of every file in dir (not its
// subdirectories) to h, in name order.
func hashSources(h io.Writer, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", e.Name(), len(b))
		_, _ = h.Write(b)
	}
	return nil
}

// staleLockAge is how old a lock file whose holder cannot be checked must be
// before it is taken to be left by a crashed process: far longer than a cold
// build of the child on a busy machine.
const staleLockAge = 30 * time.Minute

// lockFile takes an exclusive lock by creating path and writing this
// process's id into it. A lock whose holder has exited is stale and is
// broken at once; a lock held by a live process never is. A lock whose
// holder cannot be read (written by an older version, or not yet written)
// is stale after staleLockAge. waiting is called once, with the holder, if
// the lock is busy.
func lockFile(ctx context.Context, path string, waiting func(holder string)) (func(), error) {
	told := false
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			_, werr := fmt.Fprintf(f, "%d\n", os.Getpid())
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				_ = os.Remove(path)
				return nil, werr
			}
			return func() { _ = os.Remove(path) }, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		holder, stale := lockState(path)
		if stale {
			_ = os.Remove(path)
			continue
		}
		if !told && waiting != nil {
			waiting(holder)
			told = true
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s (held by %s): %w", path, holder, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// lockState reads the holder of a lock file and whether the lock is stale.
func lockState(path string) (holder string, stale bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "another process", errors.Is(err, os.ErrNotExist)
	}
	if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
		return "process " + strconv.Itoa(pid), !processAlive(pid)
	}
	st, err := os.Stat(path)
	return "another process", err == nil && time.Since(st.ModTime()) > staleLockAge
}

// startChild builds (or finds) c and runs it with args. It returns the
// first line the child prints and the function that stops it, or an error
// with the end of the child's standard error if it printed no line within
// wait.
func startChild(ctx context.Context, c childCommand, wait time.Duration, args ...string) (string, func(), error) {
	bin, err := buildChild(ctx, c)
	if err != nil {
		return "", nil, err
	}
	return runChild(ctx, bin, wait, nil, args...)
}

// runChild runs bin with args (and env added to this process's), and returns
// its first line of output and the function that stops it.
func runChild(ctx context.Context, bin string, wait time.Duration, env []string, args ...string) (string, func(), error) {
	// Not CommandContext: the child must outlive the start-up context; it
	// stops when its stdin closes (Shutdown, or this process exiting).
	cmd := exec.Command(bin, args...) //nolint:noctx // see above
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var errOut tailBuffer
	cmd.Stderr = io.MultiWriter(os.Stderr, &errOut)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	exited := make(chan struct{})
	stop := func() {
		_ = stdin.Close() // the child stops when its input closes
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(exited)
	}()
	select {
	case line, ok := <-lines:
		if !ok {
			stop()
			return "", nil, fmt.Errorf("%s did not start: %s", bin, strings.TrimSpace(errOut.String()))
		}
		return line, stop, nil
	case <-time.After(wait):
		stop()
		return "", nil, fmt.Errorf("%s did not start within %v", bin, wait)
	case <-ctx.Done():
		stop()
		return "", nil, ctx.Err()
	}
}

// tailBuffer keeps the last 4 KiB written to it; safe for concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - 4096; over > 0 {
		b.buf = b.buf[over:]
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

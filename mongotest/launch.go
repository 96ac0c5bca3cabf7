package mongotest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// EnvEmbedded chooses how the embedded backend runs FerretDB: "process" (a
// child process built from ./mongotest/ferretdbserver with the go command)
// or "inprocess" (inside the test binary). The default is "process" when the
// test binary is built with -race, where FerretDB's SQLite engine would run
// several times slower (race test binaries do not link FerretDB at all), and
// "inprocess" otherwise, where "process" falls back to "inprocess", saying
// why, when the child cannot be built or started.
const EnvEmbedded = "MONGOCAS_EMBEDDED"

// serverPackage is the command the child process is built from.
const serverPackage = "github.com/mongocas/mongocas/mongotest/ferretdbserver"

// launchFerretDB starts FerretDB with its data in dir and returns its
// address, a stop function and how it runs.
func launchFerretDB(ctx context.Context, dir string) (addr string, stop func(), how string, err error) {
	mode := strings.ToLower(os.Getenv(EnvEmbedded))
	if mode == "" {
		mode = "inprocess"
		if raceEnabled {
			mode = "process"
		}
	}
	switch mode {
	case "process":
		addr, stop, err = startChild(ctx, dir)
		if err == nil {
			return addr, stop, "child process", nil
		}
		if raceEnabled {
			return "", nil, "", fmt.Errorf("FerretDB child process: %w", err)
		}
		fmt.Fprintf(os.Stderr, "mongotest: FerretDB child process unavailable (%v); running it in-process\n", err)
	case "inprocess":
	default:
		return "", nil, "", tag(errBadSetting, fmt.Errorf("%s=%q: want process or inprocess", EnvEmbedded, mode))
	}
	addr, stop, err = runInProcess(dir)
	return addr, stop, "in-process", err
}

// goCommand finds the go command on PATH (go test puts its own toolchain's
// bin directory first there).
func goCommand() (string, error) { return exec.LookPath("go") }

// buildChild returns the path of the ferretdbserver binary (built without
// -race) for the sources and Go version at hand, building it on first use.
//
// The binary lives in the user cache directory under a name keyed by a hash
// of what it is built from (see childKey), so checkouts and versions of
// mongocas never run each other's binary, and one that exists is used as it
// is: no go command runs. A lock file keeps parallel test binaries from
// building the same file at once; the first says what it is doing, once, on
// standard error, since a cold build takes minutes.
func buildChild(ctx context.Context) (string, error) {
	goBin, err := goCommand()
	if err != nil {
		return "", fmt.Errorf("no go command on PATH to build %s: %w", serverPackage, err)
	}
	key, err := childKey(ctx, goBin)
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "mongocas")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "ferretdbserver-"+runtime.GOOS+"-"+runtime.GOARCH+"-"+key)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	unlock, err := lockFile(ctx, bin+".lock", func(holder string) {
		// The holder has said what it does; this goes to the log only.
		fmt.Fprintf(os.Stderr, "mongotest: waiting for %s to finish building the embedded server into %s\n", holder, bin)
	})
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // built while we waited
	}
	announcef("mongotest: building the embedded MongoDB-wire server (FerretDB, %s) for -race test binaries into %s; "+
		"the first build takes 1-3 minutes (about 100 s on two cores), later runs reuse it\n", serverPackage, bin)
	began := time.Now()
	tmp := fmt.Sprintf("%s.tmp-%d", bin, os.Getpid())
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", tmp, serverPackage)
	out, err := cmd.CombinedOutput()
	if err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("go build %s: %w: %s", serverPackage, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, bin); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	announcef("mongotest: built the embedded server in %v\n", time.Since(began).Round(time.Second))
	return bin, nil
}

// announcef tells the person at the terminal what is happening. go test holds
// back a test binary's output until the package's tests end (when it tests
// several packages), so a message about a minutes-long build goes to the
// controlling terminal when there is one, and to standard error otherwise
// (CI logs).
func announcef(format string, args ...any) {
	w := io.Writer(os.Stderr)
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		defer tty.Close()
		w = tty
	}
	fmt.Fprintf(w, format, args...)
}

// childKey is a hash of everything the child binary is built from: the Go
// version, the version of every module it links, and the source files of
// its packages that come from a module with no version (this checkout, or a
// local replace), whose sources can change under the same name.
func childKey(ctx context.Context, goBin string) (string, error) {
	const format = `{{if not .Standard}}{{.ImportPath}}	{{.Dir}}	{{with .Module}}{{.Path}}@{{.Version}}{{with .Replace}}=>{{.Path}}@{{.Version}}{{end}}{{end}}{{end}}`
	cmd := exec.CommandContext(ctx, goBin, "list", "-deps", "-f", format, serverPackage)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list %s: %w: %s", serverPackage, err, strings.TrimSpace(stderr.String()))
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	ver, err := exec.CommandContext(ctx, goBin, "env", "GOVERSION").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOVERSION: %w", err)
	}
	fmt.Fprintf(h, "go command %s", ver)
	for line := range strings.Lines(string(out)) {
		f := strings.Split(strings.TrimSpace(line), "\t")
		if len(f) != 3 {
			continue
		}
		fmt.Fprintf(h, "%s %s\n", f[0], f[2])
		if f[2] == "" || strings.HasSuffix(f[2], "@") { // no version, or replaced by a directory
			if err := hashSources(h, f[1]); err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// hashSources adds the name and contents of every file of the package in
// dir to h, in name order.
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

func startChild(ctx context.Context, dir string) (string, func(), error) {
	bin, err := buildChild(ctx)
	if err != nil {
		return "", nil, err
	}
	// Not CommandContext: the child must outlive the start-up context; it
	// stops when its stdin closes (Shutdown, or this process exiting).
	cmd := exec.Command(bin, "-dir", dir) //nolint:noctx // see above
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
		case <-time.After(10 * time.Second):
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
		addr, found := strings.CutPrefix(line, "LISTEN ")
		if !ok || !found {
			stop()
			return "", nil, fmt.Errorf("%s did not start: %s", bin, strings.TrimSpace(errOut.String()))
		}
		return addr, stop, nil
	case <-time.After(30 * time.Second):
		stop()
		return "", nil, fmt.Errorf("%s did not start within 30s", bin)
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

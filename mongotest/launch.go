package mongotest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
		return "", nil, "", fmt.Errorf("%s=%q: want process or inprocess", EnvEmbedded, mode)
	}
	addr, stop, err = runInProcess(dir)
	return addr, stop, "in-process", err
}

// goCommand finds the go command on PATH (go test puts its own toolchain's
// bin directory first there).
func goCommand() (string, error) { return exec.LookPath("go") }

// buildChild builds ferretdbserver (without -race) into the user cache
// directory. go build relinks only when something changed; a lock file keeps
// parallel test binaries from writing the same file at once.
func buildChild(ctx context.Context) (string, error) {
	goBin, err := goCommand()
	if err != nil {
		return "", fmt.Errorf("no go command: %w", err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "mongocas")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "ferretdbserver-"+runtime.GOOS+"-"+runtime.GOARCH)
	unlock, err := lockFile(ctx, bin+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", bin, serverPackage)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", serverPackage, err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// lockFile takes an exclusive lock by creating path; a lock older than five
// minutes is taken to be left by a crashed process.
func lockFile(ctx context.Context, path string) (func(), error) {
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			_ = f.Close()
			return func() { _ = os.Remove(path) }, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		if st, serr := os.Stat(path); serr == nil && time.Since(st.ModTime()) > 5*time.Minute {
			_ = os.Remove(path)
			continue
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s: %w", path, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
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

package mongotest

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Notices are the few lines mongotest has to say to the person running the
// tests: what it builds while it builds, and which backend a test binary
// uses. go test shows nothing a passing package's test binary writes, to
// standard output or error, unless run with -v; so in a test binary run by
// the go command a notice goes to the go command's own standard error when
// that is a terminal or a pipe (a CI log), read through /proc on Linux, else
// to the controlling terminal, else to standard error. Elsewhere (go run of a
// program that uses Open) it goes to standard error.

var (
	noticeOnce sync.Once
	noticeMu   sync.Mutex
	noticeW    io.Writer = os.Stderr
)

// noticef writes one line (format gets a newline) where notices go.
func noticef(format string, args ...any) {
	noticeOnce.Do(func() { noticeW = noticeWriter() })
	line := fmt.Sprintf(format, args...) + "\n"
	noticeMu.Lock()
	defer noticeMu.Unlock()
	_, _ = io.WriteString(noticeW, line) // one write: lines from parallel test binaries do not interleave
}

// noticeWriter picks where notices go (see above). The file it opens stays
// open for the life of the process.
func noticeWriter() io.Writer {
	if !testing.Testing() {
		return os.Stderr
	}
	if f := goCommandStderr(); f != nil {
		return f
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		return tty
	}
	return os.Stderr
}

// goCommandStderr opens the standard error of the go command that runs this
// test binary, when the parent process is a go command and that is a
// terminal or a pipe. A regular file is left alone: a second writer to it
// would overwrite, or be overwritten by, the go command's own lines.
func goCommandStderr() *os.File {
	if runtime.GOOS != "linux" {
		return nil
	}
	ppid := os.Getppid()
	exe, err := os.Readlink("/proc/" + strconv.Itoa(ppid) + "/exe")
	if err != nil || strings.TrimSuffix(filepath.Base(exe), " (deleted)") != "go" {
		return nil
	}
	path := "/proc/" + strconv.Itoa(ppid) + "/fd/2"
	st, err := os.Stat(path)
	if err != nil || st.Mode()&(os.ModeCharDevice|os.ModeNamedPipe) == 0 {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil
	}
	return f
}

// binaryName names this test binary in notices: its package's name.
func binaryName() string {
	return strings.TrimSuffix(strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe"), ".test")
}

// serverDownload says what building the server downloads, measured with
// FerretDB v1.24.2: the modules it links, unpacked, and their zip files.
const serverDownload = "about 650 MB of modules (FerretDB and the SQLite, PostgreSQL, MySQL and SAP HANA drivers it links; SQLite alone 240 MB)"

// progressEvery is how often a build in progress says so; a variable for the
// tests.
var progressEvery = 5 * time.Second

// progress says what a build is doing: once when it starts, then every
// progressEvery until it stops.
type progress struct {
	what  string // what is built, as the notices name it
	began time.Time
	done  chan struct{}
	wg    sync.WaitGroup
}

// startProgress announces the build of src into bin, with how long the last
// build took when there was one and, for the embedded server, what a first
// build downloads into the module cache modCache, and starts the periodic
// lines.
func startProgress(c childCommand, src serverSource, bin, modCache string, last lastBuild, hasLast bool) *progress {
	expect := "no build recorded here yet; a cold build, downloads included, takes 2-4 minutes on two idle cores, more on a busy machine"
	if hasLast {
		expect = fmt.Sprintf("the last build here took %s (%s)", round(time.Duration(last.Seconds*float64(time.Second))), last.At.Local().Format("2006-01-02 15:04")) //nolint:gosmopolitan // the person at this machine reads it: their local time
	}
	download := "the modules it needs"
	if c.name == ferretdbServer.name {
		download = serverDownload
	}
	noticef("mongotest: building %s from %s into %s with the go command, once: %s. "+
		"Unless they are there already, the go command first downloads %s into the Go module cache (%s); "+
		"later starts use the binary as it is and take milliseconds",
		c.desc, src, bin, expect, download, modCache)
	p := &progress{what: c.what, began: time.Now(), done: make(chan struct{})}
	p.wg.Go(func() {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-t.C:
				of := ""
				if hasLast {
					of = fmt.Sprintf(" (the last build took %s)", round(time.Duration(last.Seconds*float64(time.Second))))
				}
				noticef("mongotest: still building %s: %s so far%s", p.what, round(time.Since(p.began)), of)
			}
		}
	})
	return p
}

// stop ends the periodic lines, says how the build ended and returns how
// long it took.
func (p *progress) stop(ok bool) time.Duration {
	close(p.done)
	p.wg.Wait()
	took := time.Since(p.began)
	if ok {
		noticef("mongotest: built %s in %s", p.what, round(took))
	} else {
		noticef("mongotest: building %s failed after %s", p.what, round(took))
	}
	return took
}

func round(d time.Duration) time.Duration { return d.Round(time.Second) }

// lastBuild is the record of the last server build in the cache directory,
// so that the next one can say how long to expect.
type lastBuild struct {
	Seconds float64   `json:"seconds"`
	Source  string    `json:"source"`
	At      time.Time `json:"at"`
}

// lastBuildFile is the name of c's record in the cache directory.
func lastBuildFile(c childCommand) string { return c.name + "-last-build.json" }

func readLastBuild(dir string, c childCommand) (lastBuild, bool) {
	var r lastBuild
	b, err := os.ReadFile(filepath.Join(dir, lastBuildFile(c)))
	if err != nil || json.Unmarshal(b, &r) != nil || r.Seconds <= 0 {
		return lastBuild{}, false
	}
	return r, true
}

func writeLastBuild(dir string, c childCommand, r lastBuild) {
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	tmp := filepath.Join(dir, fmt.Sprintf("%s.tmp-%d", lastBuildFile(c), os.Getpid()))
	if os.WriteFile(tmp, b, 0o600) != nil || os.Rename(tmp, filepath.Join(dir, lastBuildFile(c))) != nil {
		_ = os.Remove(tmp)
	}
}

// keepBinaries is how many server binaries the cache directory keeps.
const keepBinaries = 3

// prune removes all but the keep most recently used binaries in dir whose
// names start with prefix (a binary is touched each time it is used), never
// keepToo nor one whose build lock is held, and returns the paths it removed.
func prune(dir, prefix string, keep int, keepToo string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	type bin struct {
		path string
		mod  time.Time
	}
	var bins []bin
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasPrefix(name, prefix) || strings.ContainsAny(strings.TrimPrefix(name, prefix), ".-") {
			continue // the lock files, partial builds and the record have a dot or a dash after the key
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		bins = append(bins, bin{filepath.Join(dir, name), info.ModTime()})
	}
	slices.SortFunc(bins, func(a, b bin) int { return b.mod.Compare(a.mod) })
	var removed []string
	for i, b := range bins {
		if i < keep || b.path == keepToo {
			continue
		}
		if _, err := os.Stat(b.path + ".lock"); err == nil {
			continue
		}
		if os.Remove(b.path) == nil {
			removed = append(removed, b.path)
		}
	}
	return removed, nil
}

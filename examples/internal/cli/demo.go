package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/mongocas/mongocas/examples/internal/scenario"
	"github.com/mongocas/mongocas/mongotest"
)

// examplesModule is the import path of the examples module: the program of
// a scenario is the package named after it.
const examplesModule = "github.com/mongocas/mongocas/examples"

// Demo runs the example program of each scenario, one after the other on one
// fresh server, and prints their rows as one table. The scenarios give the
// flags and the names; the code that runs is each program's own, which is
// why Demo builds the programs (with the go command, from the source this
// runs in) rather than linking a copy of them. The server is the -uri one or
// the embedded default, started here and handed to the programs through
// MONGODB_URI. It returns the exit status as Main does.
func Demo(about string, args []string, stdout, stderr io.Writer, scenarios ...scenario.Scenario) int {
	// Each program gets the demo's values of its own flags: learn their
	// names first, since registering binds a flag to the scenario's field
	// and resets it to its default.
	own := make([][]string, len(scenarios))
	for i, sc := range scenarios {
		scratch := flag.NewFlagSet(sc.Name(), flag.ContinueOnError)
		sc.RegisterFlags(scratch)
		scratch.VisitAll(func(f *flag.Flag) { own[i] = append(own[i], f.Name) })
	}
	fs, opt := newFlagSet("demo", about, stderr, scenarios...)
	r, code, ok := begin("demo", fs, opt, args, stderr)
	if !ok {
		return code
	}
	defer r.end()
	ctx, db := r.ctx, r.db
	// Say where it runs before building the programs, which takes a few
	// seconds the first time.
	fmt.Fprintf(stdout, "demo on %s\n\n", db.Where)
	bin, err := buildPrograms(ctx, scenarios, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 1
	}
	defer os.RemoveAll(bin)

	rep := &scenario.Report{}
	for i, sc := range scenarios {
		fmt.Fprintf(stderr, "demo: running %s (%d of %d)\n", sc.Name(), i+1, len(scenarios))
		args := []string{"-json", "-seed=" + fs.Lookup("seed").Value.String()}
		if dl, ok := ctx.Deadline(); ok {
			args = append(args, "-timeout="+time.Until(dl).String())
		}
		for _, name := range own[i] {
			args = append(args, "-"+name+"="+fs.Lookup(name).Value.String())
		}
		part, err := runProgram(ctx, filepath.Join(bin, program(sc)), args, db.URI, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "demo: %s: %v\n", sc.Name(), err)
			return 1
		}
		rep.Rows = append(rep.Rows, part.Rows...)
		rep.Skipped = append(rep.Skipped, part.Skipped...)
		if part.Events != nil {
			rep.AddEvents(*part.Events)
		}
	}
	rep.Print(stdout)
	fmt.Fprintf(stdout, "(%.1fs)\n", time.Since(r.start).Seconds())
	if !rep.OK() {
		return 1
	}
	return 0
}

// program returns the file name of sc's program.
func program(sc scenario.Scenario) string {
	if runtime.GOOS == "windows" {
		return sc.Name() + ".exe"
	}
	return sc.Name()
}

// buildPrograms builds the programs of scenarios into a new temporary
// directory, which the caller removes. It says so first, and go build -v
// names each package it compiles: the first build is not silent.
func buildPrograms(ctx context.Context, scenarios []scenario.Scenario, stderr io.Writer) (string, error) {
	bin, err := os.MkdirTemp("", "mongocas-demo-")
	if err != nil {
		return "", err
	}
	args := []string{"build", "-v", "-o", bin + string(filepath.Separator)}
	names := make([]string, len(scenarios))
	for i, sc := range scenarios {
		args = append(args, examplesModule+"/"+sc.Name())
		names[i] = sc.Name()
	}
	fmt.Fprintf(stderr, "demo: building the programs %s (go build -v)\n", strings.Join(names, ", "))
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		_ = os.RemoveAll(bin)
		return "", fmt.Errorf("build the example programs (go build, which needs the go command and this repository): %w", err)
	}
	return bin, nil
}

// runProgram runs one program with -json on the server at uri and returns
// its report. Its progress lines and errors go to stderr. An exit status of
// 1 with a report is not an error: the report says what went wrong.
func runProgram(ctx context.Context, path string, args []string, uri string, stderr io.Writer) (*scenario.Report, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	// Through the environment, not -uri: a password must not show in the
	// process list.
	cmd.Env = append(os.Environ(), mongotest.EnvURI+"="+uri)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, stderr
	// On interrupt, let the program drop its database before it ends.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	runErr := cmd.Run()
	var rep scenario.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return nil, errors.Join(runErr, fmt.Errorf("no report: %w", err))
	}
	return &rep, nil
}

// writeJSON writes rep to w as JSON.
func writeJSON(w io.Writer, rep *scenario.Report) error {
	return json.NewEncoder(w).Encode(rep)
}

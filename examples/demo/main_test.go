package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/examples/internal/cli"
	"github.com/mongocas/mongocas/examples/internal/scenario"
)

// TestDemoRunsTheProgramsEndToEnd builds the three example programs, runs
// them small on one server and checks the merged table, and the lines that
// say what it builds and runs.
func TestDemoRunsTheProgramsEndToEnd(t *testing.T) {
	var out, errOut bytes.Buffer
	code := cli.Demo("test", []string{
		"-buyers=20", "-items=5",
		"-wallets=2", "-ops=40", "-transfers=10", "-wallet-concurrency=4",
		"-users=3", "-switches=2", "-latency-min=1ms", "-latency-max=5ms",
	}, &out, &errOut, &scenario.Inventory{}, &scenario.Wallet{}, &scenario.Identity{})
	require.Equal(t, 0, code, "%s\n%s", out.String(), errOut.String())
	// It says what it builds and runs, as it goes: a first run is not silent.
	progress := errOut.String()
	require.Contains(t, progress, "demo: building the programs inventory, wallet, identity (go build -v)\n")
	for i, name := range []string{"inventory", "wallet", "identity"} {
		require.Contains(t, progress, fmt.Sprintf("demo: running %s (%d of 3)\n", name, i+1))
	}
	s := out.String()
	require.Contains(t, s, "scenario   strategy")
	require.Contains(t, s, "ok: no mongocas strategy showed an anomaly")
	for _, row := range []string{"versioned.Guarded", "versioned.Modify", "Modify, or queue when retries run out", "lease.Manager.Do", "no lock"} {
		require.Contains(t, s, row)
	}
	// The table runs from its header to the first blank line.
	_, table, ok := strings.Cut(s, "scenario   strategy")
	require.True(t, ok)
	table, _, _ = strings.Cut(table, "\n\n")
	rows := strings.Count(table, "\n")
	require.Equal(t, 9, rows+strings.Count(s, ": skipped: "), "each strategy either ran or said why not:\n%s", s)
	t.Log("\n" + s)
}

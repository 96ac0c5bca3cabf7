package readme_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProgramsRunWithNoServerGiven: a README program run as a newcomer runs
// it, with no MONGODB_URI, starts a server by itself, says on its first line
// which one, and does its work there. (cmd/mongocas's dev test checks that a
// server mongotest started is gone, with its data, after Shutdown.)
func TestProgramsRunWithNoServerGiven(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "shop")
	out, err := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./shop").CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := exec.CommandContext(t.Context(), bin)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "MONGODB_URI=") && !strings.HasPrefix(e, "MONGOCAS_BACKEND=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	require.NoError(t, err, "stderr:\n%s", stderr.String())
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	t.Logf("shop, with no MONGODB_URI:\n%s", stdout)
	require.GreaterOrEqual(t, len(lines), 3, "stdout:\n%s", stdout)
	require.True(t, strings.HasPrefix(lines[0], "server: "), "the first line says which server: %q", lines[0])
	require.NotContains(t, lines[0], "MONGODB_URI", "no MONGODB_URI was given: %q", lines[0])
	require.Equal(t, "<nil> sold out", lines[1], "a fresh server: the first run sells 3 of 5, then is sold out")
}

package scenario

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/mongotest"
)

// TestMain runs the package's tests against one shared server (see
// mongotest): the scenarios run small, on fresh databases, and check exact
// invariants for the mongocas strategies.
func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

func TestPercentiles(t *testing.T) {
	t.Parallel()
	require.Equal(t, Latency{}, percentiles(nil))
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	l := percentiles(d)
	require.Equal(t, Latency{N: 100, P50: 50 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}, l)
	require.Equal(t, Latency{N: 1, P50: time.Second, P99: time.Second, Max: time.Second}, percentiles([]time.Duration{time.Second}))
	require.Equal(t, 7*time.Millisecond, d[93], "percentiles does not reorder its input")
}

package store_test

import (
	"context"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"

	"github.com/mongocas/mongocas/store"
)

// xAllowed is every import of the driver's x/ packages the library may make,
// by file. The driver says x/ may change without notice, so the library keeps
// them in as few places as it can: store/driverx.go for the error
// classification, and versioned/rawdoc.go for bsoncore, the low-level BSON
// reader under the driver's own bson.Raw. versioned walks a document's write
// ids with it without allocating; the bson package has no public way to do
// that (RawArray.Values allocates), and a raw-BSON walker does not belong in
// store's API. Tests may import x/ freely: they are not the library.
var xAllowed = map[string][]string{
	"store/driverx.go": {
		"go.mongodb.org/mongo-driver/v2/x/mongo/driver",
		"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology",
	},
	"versioned/rawdoc.go": {
		"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore",
	},
}

// TestDriverXConfined fails if any non-test file of the library imports a
// driver x/ package other than those xAllowed lists for it.
func TestDriverXConfined(t *testing.T) {
	t.Parallel()
	const x = "go.mongodb.org/mongo-driver/v2/x/"
	seen := map[string][]string{}
	for _, pkg := range []string{"store", "retry", "versioned", "lease"} {
		files, err := filepath.Glob(filepath.Join("..", pkg, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, "no Go files in %s", pkg)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			require.NoError(t, err)
			af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			require.NoError(t, err)
			name := pkg + "/" + filepath.Base(f)
			for _, imp := range af.Imports {
				path, err := strconv.Unquote(imp.Path.Value)
				require.NoError(t, err)
				if strings.HasPrefix(path, x) {
					seen[name] = append(seen[name], path)
					require.True(t, slices.Contains(xAllowed[name], path),
						"%s imports %s: only store/driverx.go may import the driver's x/ packages; add a helper there", name, path)
				}
			}
		}
	}
	// The allowlist is exact: a file that stopped importing x/ leaves it.
	for name, paths := range xAllowed {
		require.ElementsMatch(t, paths, seen[name], "%s: update xAllowed", name)
	}
}

// TestIsDeadlineTooClose: the driver's "not sent, Timeout would be exceeded",
// wrapped, is recognised; a plain deadline is not.
func TestIsDeadlineTooClose(t *testing.T) {
	t.Parallel()
	require.True(t, store.IsDeadlineTooClose(fmt.Errorf("op: %w", driver.ErrDeadlineWouldBeExceeded)))
	require.False(t, store.IsDeadlineTooClose(fmt.Errorf("op: %w", context.DeadlineExceeded)))
	require.False(t, store.IsDeadlineTooClose(nil))
}

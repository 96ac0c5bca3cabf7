// Package readme_test checks that the Go code of the repository's README.md
// and docs/*.md is code that compiles and runs: every ```go block there is
// a whole file under examples/readme/<program>/, verbatim, so `go vet` and
// `go test` of this module compile each block as a reader copies it, with
// its package clause and imports, and its tests run it against a
// MongoDB-wire server.
package readme_test

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// repoRoot is the directory above the test holding README.md and .git.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "README.md")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "no README.md beside a .git above the test")
		dir = parent
	}
}

// block is one ```go block of a Markdown file.
type block struct {
	where string // file:line
	code  string // trimmed
}

var goFence = regexp.MustCompile("(?s)(?:^|\n)```go\n(.*?)\n```")

// goBlocks returns the ```go blocks of README.md and docs/*.md.
func goBlocks(t *testing.T, root string) []block {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	var out []block
	for _, path := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		src, err := os.ReadFile(path)
		require.NoError(t, err)
		rel, err := filepath.Rel(root, path)
		require.NoError(t, err)
		for _, m := range goFence.FindAllSubmatchIndex(src, -1) {
			line := 1 + strings.Count(string(src[:m[2]]), "\n")
			out = append(out, block{where: fmt.Sprintf("%s:%d", rel, line), code: strings.TrimSpace(string(src[m[2]:m[3]]))})
		}
	}
	return out
}

// programFiles returns the .go files of the programs under
// examples/readme, by path relative to examples/readme, trimmed. A
// program's run_test.go runs it in the tests and is not shown.
func programFiles(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("*", "*.go"))
	require.NoError(t, err)
	out := map[string]string{}
	for _, p := range paths {
		src, err := os.ReadFile(p)
		require.NoError(t, err)
		out[filepath.ToSlash(p)] = strings.TrimSpace(string(src))
	}
	return out
}

// TestREADMEMatches: every Go block of README.md and docs/*.md is a whole
// file of a program here, verbatim; every file of a program (but its
// run_test.go) is shown somewhere; and a block that is not a test is its
// directory's only non-test file, so it compiles alone, as copied.
func TestREADMEMatches(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	blocks := goBlocks(t, root)
	files := programFiles(t)
	require.NotEmpty(t, blocks)
	shown := map[string]string{}
	for _, b := range blocks {
		_, err := parser.ParseFile(token.NewFileSet(), "block.go", b.code, parser.PackageClauseOnly)
		require.NoError(t, err, "%s: a Go block must be a whole file, from its package clause", b.where)
		var match string
		for path, code := range files {
			if code == b.code {
				match = path
			}
		}
		require.NotEmpty(t, match, "%s: the block is no file under examples/readme: copy it there verbatim (or the file here into the doc)", b.where)
		require.NotContains(t, shown, match, "%s: shows %s, which %s shows already", b.where, match, shown[match])
		shown[match] = b.where
		if !strings.HasSuffix(match, "_test.go") {
			dir := filepath.Dir(match)
			for path := range files {
				if filepath.Dir(path) == dir && path != match && !strings.HasSuffix(path, "_test.go") {
					t.Errorf("%s: %s shares its package with %s, so it does not compile alone as copied", b.where, match, path)
				}
			}
		}
	}
	var unshown []string
	for path := range files {
		if _, ok := shown[path]; !ok && filepath.Base(path) != "run_test.go" {
			unshown = append(unshown, path)
		}
	}
	slices.Sort(unshown)
	require.Empty(t, unshown, "files under examples/readme that no ```go block of README.md or docs/*.md shows")
	t.Logf("%d Go blocks in README.md and docs/, each a file under examples/readme", len(blocks))
}

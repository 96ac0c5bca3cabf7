package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

// The servers whose figures README.md and docs/costs.md quote.
const (
	onEmbedded   = "embedded"   // FerretDB v1 behind mongotest's proxy
	onDocumentDB = "DocumentDB" // FerretDB v2 on DocumentDB, with $expr
)

// documentedServer says which of the servers the docs quote db is on, or
// "" for one they do not quote (MongoDB itself, say).
func documentedServer(db *mongotest.DB) string {
	switch {
	case db.Server.Backend == mongotest.BackendEmbedded:
		return onEmbedded
	case db.Caps().Server == store.FerretDBv2:
		return onDocumentDB
	}
	return ""
}

var spaces = regexp.MustCompile(`\s+`)

// requireQuoted fails t unless every phrase is in the file (a path from the
// repository's root), line breaks and runs of spaces counting as one space:
// the docs quote what the test measured, and a changed figure fails here
// until the docs say it.
func requireQuoted(t *testing.T, file string, phrases ...string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), file))
	if err != nil {
		t.Fatal(err)
	}
	text := spaces.ReplaceAllString(string(b), " ")
	for _, p := range phrases {
		if !strings.Contains(text, spaces.ReplaceAllString(p, " ")) {
			t.Errorf("%s does not say %q, which is what this run measured: correct the figure there", file, p)
		}
	}
}

// Package errmsg holds checks on error messages shared by the server-backed
// tests of every library package.
package errmsg

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// prefixes are the package prefixes of mongocas's error messages.
var prefixes = []string{"lease: ", "versioned: ", "store: ", "retry: ", "mongotest: ", "deferred: ", "idempotency: "}

// RequireOnePrefix fails t unless err is non-nil and its message names each
// package at most once: "versioned: get x: document not found", never
// "versioned: get x: versioned: document not found".
func RequireOnePrefix(t testing.TB, err error) {
	t.Helper()
	require.Error(t, err)
	msg := err.Error()
	for _, p := range prefixes {
		require.LessOrEqual(t, strings.Count(msg, p), 1, "prefix %q repeats in %q", p, msg)
	}
}

package scenario

import (
	"fmt"
	"strings"
	"unicode"
)

// slug turns a strategy name into a collection-name part.
func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('_')
			dash = true
		}
	}
	return strings.TrimRight(b.String(), "_")
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// plural formats n into format (which takes n and a plural "s") when n > 0,
// and returns "" otherwise.
func plural(n int, format string) string {
	switch n {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf(format, n, "")
	}
	return fmt.Sprintf(format, n, "s")
}

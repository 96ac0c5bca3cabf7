package idempotency

import (
	"crypto/sha256"
	"strings"
	"unicode/utf8"
)

// MaxKeyLen is the longest key accepted, in bytes (Stripe's limit too).
const MaxKeyLen = 255

// MaxScopeLen is the longest scope accepted, in bytes.
const MaxScopeLen = 255

// scopeSep separates a scope from the key in a record's _id. A key never
// contains it (keys are printable ASCII), so the last one in an _id splits it
// unambiguously.
const scopeSep = "\n"

// CheckKey reports whether key can be used as an idempotency key: 1 to
// MaxKeyLen bytes of printable ASCII (0x20 to 0x7E, the characters of an HTTP
// structured-field string, so that a UUID, a ULID or a base64 value all fit)
// without "$". Keys are only ever compared with $eq, so no key could act as
// an operator; keys shaped like one ($where, {"$gt": ""}) are refused all the
// same, so that such input is reported to its sender instead of being
// stored. It returns a *KeyError (matching ErrInvalidKey and ErrInvalid).
func CheckKey(key string) error {
	switch {
	case key == "":
		return &KeyError{Key: key, Reason: "empty"}
	case len(key) > MaxKeyLen:
		return &KeyError{Key: key, Reason: "longer than 255 bytes"}
	case strings.Contains(key, "$"):
		return &KeyError{Key: key, Reason: `contains "$", like a query operator`}
	}
	for i := range len(key) {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return &KeyError{Key: key, Reason: "not printable ASCII (0x20 to 0x7E)"}
		}
	}
	return nil
}

// checkScope reports whether scope can scope keys: valid UTF-8 of at most
// MaxScopeLen bytes without NUL. The empty scope is the default one.
func checkScope(key, scope string) error {
	switch {
	case len(scope) > MaxScopeLen:
		return &KeyError{Key: key, Reason: "scope longer than 255 bytes"}
	case !utf8.ValidString(scope):
		return &KeyError{Key: key, Reason: "scope is not valid UTF-8"}
	case strings.ContainsRune(scope, 0):
		return &KeyError{Key: key, Reason: "scope contains NUL"}
	}
	return nil
}

// recordID returns the _id of the record of key in scope: the key itself in
// the default scope, else scope + "\n" + key.
func recordID(scope, key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	if err := checkScope(key, scope); err != nil {
		return "", err
	}
	if scope == "" {
		return key, nil
	}
	return scope + scopeSep + key, nil
}

// digest is what a record keeps of a fingerprint: its SHA-256.
func digest(fingerprint []byte) []byte {
	sum := sha256.Sum256(fingerprint)
	return sum[:]
}

// ParseHeader returns the idempotency key carried by the values of an
// Idempotency-Key header field (http.Header.Values). The IETF draft makes
// the field a structured-field string, "…" with \" and \\ escapes; a bare
// value (as Stripe's clients send) is taken as it is. Surrounding spaces
// and tabs are dropped. Several values, an empty one, a malformed string and
// a key CheckKey refuses are errors (*KeyError); no values at all is ("",
// nil): the header is missing.
func ParseHeader(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", &KeyError{Key: strings.Join(values, ", "), Reason: "the header is given more than once"}
	}
	v := strings.Trim(values[0], " \t")
	if strings.Contains(v, ",") && !strings.HasPrefix(v, `"`) {
		return "", &KeyError{Key: v, Reason: "the header holds a list, not one key"}
	}
	if !strings.HasPrefix(v, `"`) {
		return v, CheckKey(v)
	}
	key, err := parseSFString(v)
	if err != nil {
		return "", err
	}
	return key, CheckKey(key)
}

// parseSFString parses a structured-field string (RFC 9651, 3.3.3):
// DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE, where unescaped is
// printable ASCII other than DQUOTE and "\". Nothing may follow it.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", &KeyError{Key: v, Reason: `a structured-field string may escape only " and \`}
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", &KeyError{Key: v, Reason: "characters after the closing quote"}
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", &KeyError{Key: v, Reason: "not printable ASCII (0x20 to 0x7E)"}
		default:
			b.WriteByte(c)
		}
	}
	return "", &KeyError{Key: v, Reason: "no closing quote"}
}

package idempotency

import (
	"crypto/sha256"
	"strings"
	"unicode/utf8"
)

// The longest key (Stripe's limit too) and scope accepted, in bytes.
const (
	MaxKeyLen   = 255
	MaxScopeLen = 255
)

// CheckKey reports whether key can be used as an idempotency key: 1 to
// MaxKeyLen bytes of printable ASCII (0x20 to 0x7E, the characters of an HTTP
// structured-field string: a UUID, a ULID or a base64 value all fit) without
// "$" (keys are compared with $eq only; one shaped like an operator is
// refused all the same, to tell its sender). It returns a *KeyError
// (matching ErrInvalidKey and ErrInvalid).
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

// newRef checks key and scope (valid UTF-8 of at most MaxScopeLen bytes
// without NUL) and names their record (DESIGN.md, "The record").
func newRef(scope, key string) (keyRef, error) {
	if err := CheckKey(key); err != nil {
		return keyRef{}, err
	}
	var reason string
	switch {
	case len(scope) > MaxScopeLen:
		reason = "scope longer than 255 bytes"
	case !utf8.ValidString(scope):
		reason = "scope is not valid UTF-8"
	case strings.ContainsRune(scope, 0):
		reason = "scope contains NUL"
	case scope == "":
		return keyRef{id: key, key: key}, nil
	default:
		return keyRef{id: scope + "\n" + key, key: key, scope: scope}, nil
	}
	return keyRef{}, &KeyError{Key: key, Reason: reason}
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
	return parseSFString(v)
}

// parseSFString parses a structured-field string (RFC 9651, 3.3.3) that
// nothing follows, and checks it with CheckKey.
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
			return b.String(), CheckKey(b.String())
		case c < 0x20 || c > 0x7e:
			return "", &KeyError{Key: v, Reason: "not printable ASCII (0x20 to 0x7E)"}
		default:
			b.WriteByte(c)
		}
	}
	return "", &KeyError{Key: v, Reason: "no closing quote"}
}

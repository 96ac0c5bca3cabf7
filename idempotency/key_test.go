package idempotency_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/idempotency"
)

func TestCheckKey(t *testing.T) {
	for _, ok := range []string{"a", "8e03978e-40d5-43e8-bc93-6894a57f9324", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "a b", `quote"in`, strings.Repeat("k", 255)} {
		require.NoError(t, idempotency.CheckKey(ok), "%q", ok)
	}
	for _, bad := range []string{"", strings.Repeat("k", 256), "$gt", `{"$ne":null}`, "a\tb", "a\nb", "é", "\x00"} {
		err := idempotency.CheckKey(bad)
		require.ErrorIs(t, err, idempotency.ErrInvalidKey, "%q", bad)
		require.ErrorIs(t, err, idempotency.ErrInvalid, "%q", bad)
		require.True(t, strings.HasPrefix(err.Error(), "idempotency: key "), err.Error())
	}
	long := idempotency.CheckKey(strings.Repeat("k", 1000)).Error()
	require.Less(t, len(long), 200, "a long key is shortened in messages: %s", long)
}

func TestParseHeader(t *testing.T) {
	for in, want := range map[string]string{
		`abc`:             "abc",
		`"abc"`:           "abc",
		` "abc" `:         "abc",
		"\tabc\t":         "abc",
		`"a\"b\\c"`:       `a"b\c`,
		`"with, comma"`:   "with, comma",
		`"8e03978e-40d5"`: "8e03978e-40d5",
	} {
		got, err := idempotency.ParseHeader([]string{in})
		require.NoError(t, err, "%q", in)
		require.Equal(t, want, got, "%q", in)
	}
	got, err := idempotency.ParseHeader(nil)
	require.NoError(t, err)
	require.Empty(t, got, "missing")
	for _, bad := range [][]string{
		{`""`}, {``}, {`"abc`}, {`"a"b`}, {`"a\b"`}, {`"a\`}, {"\"a\tb\""}, {`a, b`}, {"a", "b"}, {`"$where"`},
	} {
		_, err := idempotency.ParseHeader(bad)
		require.ErrorIs(t, err, idempotency.ErrInvalidKey, "%q", bad)
	}
}

// FuzzParseHeader: whatever the header holds, ParseHeader either refuses it
// with ErrInvalidKey or returns a key CheckKey accepts; and a key quoted as
// a structured-field string parses back to itself.
func FuzzParseHeader(f *testing.F) {
	for _, s := range []string{`abc`, `"abc"`, `"a\"b"`, `"`, `\`, `"a\`, ` "x" `, "$", "a,b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := idempotency.ParseHeader([]string{v})
		if err != nil {
			require.ErrorIs(t, err, idempotency.ErrInvalidKey)
			return
		}
		require.NoError(t, idempotency.CheckKey(key), "%q gave %q", v, key)
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		back, err := idempotency.ParseHeader([]string{quoted})
		require.NoError(t, err)
		require.Equal(t, key, back)
	})
}

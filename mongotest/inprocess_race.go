//go:build race

package mongotest

import "errors"

// raceEnabled reports whether this binary is built with -race.
const raceEnabled = true

// runInProcess is not available under -race: FerretDB is left out of race
// test binaries, where it would run several times slower and cost minutes
// of race-instrumented compilation; the child process serves instead.
func runInProcess(string) (string, func(), error) {
	return "", nil, errors.New("FerretDB is not linked into -race test binaries; " +
		"the embedded backend needs its child process there (the go command on PATH)")
}

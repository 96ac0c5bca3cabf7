//go:build !race

package mongotest

import "github.com/mongocas/mongocas/mongotest/internal/embedded"

// raceEnabled reports whether this binary is built with -race.
const raceEnabled = false

// runInProcess runs FerretDB inside this process.
func runInProcess(dir string) (string, func(), error) {
	return embedded.Run(embedded.SQLiteURL(dir))
}

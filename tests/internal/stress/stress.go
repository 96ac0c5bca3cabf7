// Package stress is the suite's switch between the default sizes of its
// concurrency and soak tests, which prove each invariant in seconds, and
// the stress sizes (thousands of jobs, long storms) that CI's DocumentDB
// stage runs: MONGOCAS_STRESS=1.
package stress

import "os"

// Env is the environment variable that turns the stress sizes on.
const Env = "MONGOCAS_STRESS"

// On reports whether the stress sizes are asked for.
func On() bool { return os.Getenv(Env) != "" && os.Getenv(Env) != "0" }

// Pick returns stressed when the stress sizes are asked for, else def.
func Pick[T any](def, stressed T) T {
	if On() {
		return stressed
	}
	return def
}

//go:build !unix

package mongotest

import "os"

// processAlive reports whether a process with this id exists on this
// machine, as far as os.FindProcess can tell.
func processAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	_ = p.Release()
	return true
}

//go:build unix

package mongotest

import (
	"errors"
	"syscall"
)

// processAlive reports whether a process with this id exists on this
// machine (one we may not signal exists too).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

//go:build unix

package deadletter

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive advisory lock on f without waiting; the lock
// goes away with the descriptor, so a crashed run leaves none behind.
func lockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}

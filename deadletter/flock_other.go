//go:build !unix

package deadletter

import "os"

// lockFile is a no-op where flock(2) is missing: concurrent replays of one
// run id are then the caller's to avoid.
func lockFile(*os.File) error { return nil }

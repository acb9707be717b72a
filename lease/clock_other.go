//go:build !linux

package lease

import "time"

var processStart = time.Now()

// bootNow falls back to Go's monotonic clock where the system offers no boot
// clock: correct while the host does not suspend (documented in
// docs/safety.md).
func bootNow() time.Duration { return time.Since(processStart) }

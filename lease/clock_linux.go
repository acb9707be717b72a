//go:build linux

package lease

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootNow reads CLOCK_BOOTTIME, which unlike CLOCK_MONOTONIC (Go's
// monotonic clock) counts the time the system spent suspended.
func bootNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// CLOCK_BOOTTIME exists since Linux 2.6.39; a kernel without it
		// cannot run walden's other requirements either.
		panic("lease: CLOCK_BOOTTIME unavailable: " + err.Error())
	}
	return time.Duration(ts.Nano())
}

package lease

import "time"

// Clock reads a machine's boot clock: a monotonic clock that keeps running
// while the host is suspended. Readings are durations since an arbitrary
// origin and are compared only with readings of the same Clock.
type Clock interface {
	Now() time.Duration
}

// ClockFunc adapts a function to Clock.
type ClockFunc func() time.Duration

// Now implements Clock.
func (f ClockFunc) Now() time.Duration { return f() }

// BootClock is the machine's boot clock (CLOCK_BOOTTIME on Linux).
var BootClock Clock = bootClock{}

type bootClock struct{}

func (bootClock) Now() time.Duration { return bootNow() }

// ManualClock is a Clock that tests move by hand. Its zero value reads 0.
type ManualClock struct{ T time.Duration }

// Now implements Clock.
func (c *ManualClock) Now() time.Duration { return c.T }

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) { c.T += d }

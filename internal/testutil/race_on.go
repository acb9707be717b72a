//go:build race

package testutil

// raceSlack: the race detector makes code 2–20 times slower; waits grow
// with it.
const raceSlack = 4

// Race reports whether the tests run under the race detector.
const Race = true

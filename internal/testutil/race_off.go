//go:build !race

package testutil

const raceSlack = 1

// Race reports whether the tests run under the race detector.
const Race = false

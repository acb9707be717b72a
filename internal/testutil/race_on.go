//go:build race

package testutil

// raceSlack: the race detector makes code 2–20 times slower; waits grow
// with it.
const raceSlack = 4

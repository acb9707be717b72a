//go:build !race

package testutil

const raceSlack = 1

//go:build !linux

package recovery

import "os/exec"

// ownProcessGroup is a no-op where process groups are not used: the
// command alone is killed on cancellation.
func ownProcessGroup(*exec.Cmd) {}

func killGroup(*exec.Cmd) {}

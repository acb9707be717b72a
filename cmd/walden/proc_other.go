//go:build !linux

package main

import "os/exec"

// dieWithParent is a no-op where the platform cannot tie a child's life to
// its parent's.
func dieWithParent(*exec.Cmd) {}

//go:build !linux

package devcluster

import "os/exec"

// dieWithParent is a no-op where the platform has no parent-death signal;
// Cluster.Close still kills every child.
func dieWithParent(*exec.Cmd) {}

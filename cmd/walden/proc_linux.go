package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes a child process receive SIGKILL when walden itself
// dies, so that an interrupted `walden dev` leaves nothing running.
func dieWithParent(c *exec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

package devcluster

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes a child process receive SIGKILL when its parent dies,
// so that an interrupted run leaves nothing running.
func dieWithParent(c *exec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

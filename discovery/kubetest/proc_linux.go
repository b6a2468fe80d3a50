package kubetest

import "syscall"

// terminate asks a child to stop.
const terminate = syscall.SIGTERM

// childAttrs kill the servers with the test binary even when it dies
// without running its cleanups (a panic elsewhere, a -timeout).
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

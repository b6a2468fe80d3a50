//go:build !linux

package kubetest

import (
	"os"
	"syscall"
)

// terminate asks a child to stop.
var terminate = os.Interrupt

// childAttrs: only Linux can tie a child's life to its parent's.
func childAttrs() *syscall.SysProcAttr { return nil }

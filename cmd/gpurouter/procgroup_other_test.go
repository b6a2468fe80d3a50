//go:build !unix

package main

import "os/exec"

// ownGroup does nothing where there are no process groups: killGroup
// kills the process alone.
func ownGroup(*exec.Cmd) {}

// killGroup kills cmd's process.
func killGroup(cmd *exec.Cmd) error { return cmd.Process.Kill() }

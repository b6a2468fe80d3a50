//go:build !race

package proxy

// raceBuild is false: see race_on.go.
const raceBuild = false

//go:build !race

package netloop

// raceBuild is false: see race_on.go.
const raceBuild = false

//go:build tools

// Package tools pins k8s.io/kubernetes/cmd/kube-apiserver so that `go mod tidy`
// keeps its dependencies; the binary is built with `go build
// k8s.io/kubernetes/cmd/kube-apiserver` inside this module.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"

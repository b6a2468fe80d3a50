package kvevents

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// ExpandEndpoint fills an endpoint template from a replica's base URL:
// "{host}" becomes the URL's host (bracketed when it is an IPv6 address),
// so one pool setting (kv_events.endpoint: "tcp://{host}:5557") serves
// every replica, those found by discovery included; "{port}" becomes the
// URL's port and "{port+N}" (or "{port-N}") that port offset by N, for
// engines sharing a host that publish on ports beside their HTTP ports. A
// template without either is returned as it is (one replica, or an
// explicit address).
func ExpandEndpoint(template, replicaURL string) (string, error) {
	if !strings.Contains(template, "{host}") && !strings.Contains(template, "{port") {
		return checkEndpoint(template)
	}
	u, err := url.Parse(replicaURL)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("%w: replica URL %q has no host", ErrEndpoint, replicaURL)
	}
	host := u.Hostname()
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	out := strings.ReplaceAll(template, "{host}", host)
	if i := strings.Index(out, "{port"); i >= 0 {
		j := strings.IndexByte(out[i:], '}')
		if j < 0 {
			return "", fmt.Errorf("%w: %q: unclosed {port", ErrEndpoint, template)
		}
		port, err := strconv.Atoi(u.Port())
		if err != nil {
			return "", fmt.Errorf("%w: replica URL %q has no port for {port}", ErrEndpoint, replicaURL)
		}
		off := 0
		if arg := out[i+len("{port") : i+j]; arg != "" {
			if off, err = strconv.Atoi(arg); err != nil || (arg[0] != '+' && arg[0] != '-') {
				return "", fmt.Errorf("%w: %q: want {port}, {port+N} or {port-N}", ErrEndpoint, template)
			}
		}
		if port+off <= 0 || port+off > 65535 {
			return "", fmt.Errorf("%w: %q: port %d out of range for %s", ErrEndpoint, template, port+off, replicaURL)
		}
		out = out[:i] + strconv.Itoa(port+off) + out[i+j+1:]
	}
	return checkEndpoint(out)
}

// OffsetPort adds n to a tcp endpoint's port, as vLLM offsets each
// data-parallel rank's sockets (rank r publishes on port+r).
func OffsetPort(endpoint string, n int) (string, error) {
	if _, err := checkEndpoint(endpoint); err != nil {
		return "", err
	}
	i := strings.LastIndexByte(endpoint, ':')
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil || port+n <= 0 || port+n > 65535 {
		return "", fmt.Errorf("%w: %q: port out of range after +%d", ErrEndpoint, endpoint, n)
	}
	return endpoint[:i+1] + strconv.Itoa(port+n), nil
}

// checkEndpoint accepts tcp://HOST:PORT, the only transport that reaches
// another machine (and the one the router and simulator use).
func checkEndpoint(ep string) (string, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("%w: %q: want tcp://host:port", ErrEndpoint, ep)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || host == "" {
		return "", fmt.Errorf("%w: %q: want tcp://host:port", ErrEndpoint, ep)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return "", fmt.Errorf("%w: %q: bad port", ErrEndpoint, ep)
	}
	return ep, nil
}

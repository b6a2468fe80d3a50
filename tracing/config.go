package tracing

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Protocol is how spans travel to the OTLP receiver.
type Protocol string

const (
	// ProtocolGRPC is OTLP over gRPC (a Collector's port 4317).
	ProtocolGRPC Protocol = "grpc"
	// ProtocolHTTP is OTLP over HTTP with protobuf bodies (port 4318).
	ProtocolHTTP Protocol = "http"
)

// Protocols are the accepted Protocol values, for documentation and
// validation messages. Read-only.
var Protocols = []Protocol{ProtocolGRPC, ProtocolHTTP}

// The defaults a zero field stands for.
const (
	// DefaultProtocol is the protocol of a Config whose Protocol is "".
	DefaultProtocol = ProtocolGRPC
	// DefaultTimeout bounds one export (and Shutdown, when its context has
	// no deadline): the OTLP exporters' own default.
	DefaultTimeout = 10 * time.Second
	// DefaultSamplingRatio is the share of new traces recorded when
	// SamplingRatio is nil: every one.
	DefaultSamplingRatio = 1.0
	// DefaultServiceName is the service.name of the router's resource
	// unless ResourceAttributes (or OTEL_SERVICE_NAME) names another.
	DefaultServiceName = "gpurouter"
	// HTTPTracesPath is the path an http endpoint without one is given:
	// the OTLP/HTTP traces path.
	HTTPTracesPath = "/v1/traces"
)

// Config is where the router's spans go and which requests it records.
// The zero value is tracing off: no exporter, no goroutine, and every
// Request method a no-op that allocates nothing.
type Config struct {
	// Endpoint is the OTLP receiver: http://HOST:PORT (plain text) or
	// https://HOST:PORT (TLS, the system's roots or
	// OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE). For ProtocolHTTP a path may
	// follow and is used as given; without one, HTTPTracesPath. ""
	// means tracing off.
	Endpoint string
	// Protocol is grpc or http; "" means DefaultProtocol.
	Protocol Protocol
	// Headers go with every export (an API key, a tenant). nil means
	// none here: then OTEL_EXPORTER_OTLP_[TRACES_]HEADERS apply, which is
	// how a secret stays out of a configuration file.
	Headers map[string]string
	// SamplingRatio is the share of the traces the router starts itself
	// (requests without a valid traceparent) that are recorded, 0 to 1.
	// A request whose caller sent a traceparent follows the caller's
	// sampled flag (parent-based sampling), so 0 records only the
	// requests a caller chose to trace. nil means DefaultSamplingRatio.
	SamplingRatio *float64
	// ResourceAttributes describe this router in every span's resource
	// (deployment.environment.name, k8s.cluster.name, ...); they win over
	// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, which win over the
	// defaults (service.name DefaultServiceName, host.name, the SDK's).
	// nil means none.
	ResourceAttributes map[string]string
	// Timeout bounds one export; 0 means DefaultTimeout.
	Timeout time.Duration
}

// Enabled reports whether c turns tracing on: it names an endpoint.
func (c Config) Enabled() bool { return c.Endpoint != "" }

// protocol is c.Protocol with its default.
func (c Config) protocol() Protocol {
	if c.Protocol == "" {
		return DefaultProtocol
	}
	return c.Protocol
}

// samplingRatio is c.SamplingRatio with its default.
func (c Config) samplingRatio() float64 {
	if c.SamplingRatio == nil {
		return DefaultSamplingRatio
	}
	return *c.SamplingRatio
}

// timeout is c.Timeout with its default.
func (c Config) timeout() time.Duration {
	if c.Timeout == 0 {
		return DefaultTimeout
	}
	return c.Timeout
}

// Sentinels of Validate's errors, one per field, for errors.Is.
var (
	ErrEndpoint          = errors.New("tracing: invalid endpoint")
	ErrProtocol          = errors.New("tracing: invalid protocol")
	ErrHeader            = errors.New("tracing: invalid header")
	ErrSamplingRatio     = errors.New("tracing: invalid sampling ratio")
	ErrResourceAttribute = errors.New("tracing: invalid resource attribute")
	ErrTimeout           = errors.New("tracing: invalid timeout")
)

// FieldError is one problem Validate found: the field at fault by its
// configuration key (endpoint, headers.NAME, ...), what is wrong, and the
// field's sentinel (Unwrap), so a caller can prefix the key with its own
// path.
type FieldError struct {
	Key string
	Msg string
	Err error // the field's sentinel: ErrEndpoint, ErrProtocol, ...
}

func (e *FieldError) Error() string { return e.Key + ": " + e.Msg }
func (e *FieldError) Unwrap() error { return e.Err }

// Validate reports every problem of c, each a *FieldError, joined with
// errors.Join; nil when c is usable (the zero Config is). The fields are
// checked even while Endpoint is "", so that a configuration is refused
// the same way before and after tracing is switched on.
func (c Config) Validate() error {
	var errs []error
	bad := func(key string, sentinel error, format string, args ...any) {
		errs = append(errs, &FieldError{Key: key, Msg: fmt.Sprintf(format, args...), Err: sentinel})
	}
	if !slices.Contains(Protocols, c.protocol()) {
		bad("protocol", ErrProtocol, "must be grpc or http, got %q", c.Protocol)
	}
	if c.Endpoint != "" {
		if msg := checkEndpoint(c.Endpoint, c.protocol()); msg != "" {
			bad("endpoint", ErrEndpoint, "%s", msg)
		}
	}
	for _, k := range sortedKeys(c.Headers) {
		if !isToken(k) {
			bad("headers."+k, ErrHeader, "must be an HTTP header name (letters, digits and !#$%%&'*+-.^_`|~)")
		} else if isReservedHeader(k) {
			bad("headers."+k, ErrHeader, "is set by the exporter itself")
		}
		if strings.ContainsAny(c.Headers[k], "\r\n\x00") {
			bad("headers."+k, ErrHeader, "value must not contain CR, LF or NUL")
		}
	}
	if r := c.samplingRatio(); math.IsNaN(r) || r < 0 || r > 1 {
		bad("sampling_ratio", ErrSamplingRatio, "must be in [0, 1], got %g", r)
	}
	for _, k := range sortedKeys(c.ResourceAttributes) {
		if k == "" || strings.TrimSpace(k) != k {
			bad("resource_attributes", ErrResourceAttribute, "key %q must be non-empty without surrounding spaces", k)
		}
	}
	if c.Timeout < 0 {
		bad("timeout", ErrTimeout, "must be >= 0 (0: %v), got %v", DefaultTimeout, c.Timeout)
	}
	return errors.Join(errs...)
}

// checkEndpoint says what is wrong with endpoint for p; "" when nothing.
func checkEndpoint(endpoint string, p Protocol) string {
	u, err := url.Parse(endpoint)
	switch {
	case err != nil:
		return fmt.Sprintf("must be a URL such as http://otel-collector:4317: %v", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Sprintf("must start with http:// (plain text) or https:// (TLS), got %q", endpoint)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Sprintf("must name a host, e.g. http://otel-collector:4317, got %q", endpoint)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return fmt.Sprintf("must have no user, query or fragment, got %q", endpoint)
	case p == ProtocolGRPC && u.Path != "" && u.Path != "/":
		return fmt.Sprintf("a gRPC endpoint has no path, got %q", u.Path)
	}
	return ""
}

// isReservedHeader: headers the exporters set themselves, which a
// configured value would corrupt.
func isReservedHeader(k string) bool {
	switch k = strings.ToLower(k); k {
	case "content-type", "content-length", "content-encoding", "host", "te", "user-agent":
		return true
	}
	return strings.HasPrefix(k, "grpc-") // gRPC's own metadata

}

// isToken reports whether s is an RFC 9110 token (a header field name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

package main

import (
	"bytes"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/tracing"
)

const onePool = "pools: [{model: m, replicas: [{url: 'http://a:1'}]}]\n"

func TestConfigTracingDefaults(t *testing.T) {
	cfg, err := parseConfig([]byte(onePool))
	if err != nil {
		t.Fatal(err)
	}
	tc := cfg.Tracing
	if tc.Endpoint != "" || tc.Protocol != "grpc" || tc.SamplingRatio == nil || *tc.SamplingRatio != 1 ||
		tc.Timeout != 10*time.Second || tc.Headers != nil || tc.ResourceAttributes != nil {
		t.Errorf("defaults %+v", tc)
	}
	if tracingFrom(tc).Enabled() {
		t.Error("tracing on by default")
	}
}

func TestConfigTracing(t *testing.T) {
	cfg, err := parseConfig([]byte(`tracing:
  endpoint: https://otlp.example.com:4318/v1/traces
  protocol: http
  headers: {authorization: Bearer s3cret}
  sampling_ratio: 0
  resource_attributes: {deployment.environment.name: prod}
  timeout: 3s
` + onePool))
	if err != nil {
		t.Fatal(err)
	}
	zero := 0.0
	want := tracing.Config{Endpoint: "https://otlp.example.com:4318/v1/traces", Protocol: tracing.ProtocolHTTP,
		Headers: map[string]string{"authorization": "Bearer s3cret"}, SamplingRatio: &zero,
		ResourceAttributes: map[string]string{"deployment.environment.name": "prod"}, Timeout: 3 * time.Second}
	if got := tracingFrom(cfg.Tracing); !reflect.DeepEqual(got, want) {
		t.Errorf("tracing.Config\n got %+v\nwant %+v", got, want)
	}

	// --print-config hides the headers' values and shows the rest; the
	// unredacted print loads back equal.
	var shown bytes.Buffer
	if err := writeConfigYAML(&shown, redacted(cfg)); err != nil {
		t.Fatal(err)
	}
	if out := shown.String(); strings.Contains(out, "s3cret") || !strings.Contains(out, "authorization: REDACTED") ||
		!strings.Contains(out, "sampling_ratio: 0\n") || !strings.Contains(out, "endpoint: https://otlp.example.com:4318/v1/traces") {
		t.Errorf("--print-config:\n%s", out)
	}
	if cfg.Tracing.Headers["authorization"] != "Bearer s3cret" {
		t.Error("redacted changed the configuration itself")
	}
	var full bytes.Buffer
	if err := writeConfigYAML(&full, cfg); err != nil {
		t.Fatal(err)
	}
	back, err := parseConfig(full.Bytes())
	if err != nil || !reflect.DeepEqual(back, cfg) {
		t.Errorf("round trip: %v\n%s", err, full.String())
	}
}

func TestConfigTracingRejects(t *testing.T) {
	_, err := parseConfig([]byte(`tracing:
  endpoint: otel-collector:4317
  protocol: thrift
  headers: {"bad name": x}
  sampling_ratio: 1.5
  timeout: -1s
  colour: blue
` + onePool))
	// The unknown key stops the decode before validation.
	assertErrContains(t, err, []string{"tracing.colour: unknown key at line 7", "known keys: endpoint, protocol, headers"})

	_, err = parseConfig([]byte(`tracing:
  endpoint: otel-collector:4317
  protocol: thrift
  headers: {"bad name": x}
  sampling_ratio: 1.5
  timeout: -1s
` + onePool))
	assertErrContains(t, err, []string{
		`tracing.protocol: must be grpc or http, got "thrift"`,
		"tracing.endpoint: must start with http:// (plain text) or https:// (TLS)",
		"tracing.headers.bad name: must be an HTTP header name",
		"tracing.sampling_ratio: must be in [0, 1], got 1.5",
		"tracing.timeout: must be >= 0",
	})
	_, err = parseConfig([]byte("tracing: {endpoint: 'http://c:4317/v1/traces'}\n" + onePool))
	assertErrContains(t, err, []string{"tracing.endpoint: a gRPC endpoint has no path"})
}

func TestRestartOnlyTracing(t *testing.T) {
	a, err := parseConfig([]byte(onePool))
	if err != nil {
		t.Fatal(err)
	}
	b := a
	b.Tracing.Endpoint = "http://c:4317"
	if got := restartOnly(a, b); !slices.Contains(got, "tracing") {
		t.Errorf("restartOnly = %v, want tracing in it", got)
	}
}

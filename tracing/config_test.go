package tracing

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	ratio := func(f float64) *float64 { return &f }
	tests := []struct {
		name string
		cfg  Config
		want []error  // sentinels, one per problem
		msgs []string // substrings of the error
	}{
		{name: "zero: off", cfg: Config{}},
		{name: "grpc", cfg: Config{Endpoint: "http://otel-collector:4317"}},
		{name: "grpc trailing slash", cfg: Config{Endpoint: "https://otel-collector:4317/"}},
		{name: "http with path", cfg: Config{Endpoint: "https://otlp.example.com/otlp/v1/traces", Protocol: ProtocolHTTP}},
		{name: "every field", cfg: Config{Endpoint: "http://[::1]:4318", Protocol: ProtocolHTTP,
			Headers: map[string]string{"Authorization": "Bearer x", "x-tenant": "a"}, SamplingRatio: ratio(0),
			ResourceAttributes: map[string]string{"deployment.environment.name": "prod"}, Timeout: time.Second}},
		{name: "off still checks its fields", cfg: Config{Protocol: "udp"}, want: []error{ErrProtocol}},
		{name: "no scheme", cfg: Config{Endpoint: "otel-collector:4317"}, want: []error{ErrEndpoint}, msgs: []string{"endpoint: must start with http://"}},
		{name: "bad scheme", cfg: Config{Endpoint: "grpc://c:4317"}, want: []error{ErrEndpoint}},
		{name: "no host", cfg: Config{Endpoint: "http://:4317"}, want: []error{ErrEndpoint}, msgs: []string{"must name a host"}},
		{name: "grpc path", cfg: Config{Endpoint: "http://c:4317/v1/traces"}, want: []error{ErrEndpoint}, msgs: []string{"gRPC endpoint has no path"}},
		{name: "query", cfg: Config{Endpoint: "http://c:4318/?x=1", Protocol: ProtocolHTTP}, want: []error{ErrEndpoint}},
		{name: "user", cfg: Config{Endpoint: "http://u:p@c:4318", Protocol: ProtocolHTTP}, want: []error{ErrEndpoint}},
		{name: "unparsable", cfg: Config{Endpoint: "http://c:43 17"}, want: []error{ErrEndpoint}},
		{name: "header name", cfg: Config{Headers: map[string]string{"bad name": "v"}}, want: []error{ErrHeader}, msgs: []string{"headers.bad name: must be an HTTP header name"}},
		{name: "header value", cfg: Config{Headers: map[string]string{"x": "a\r\nb: c"}}, want: []error{ErrHeader}},
		{name: "reserved header", cfg: Config{Headers: map[string]string{"Content-Type": "x", "grpc-timeout": "1S"}}, want: []error{ErrHeader, ErrHeader}},
		{name: "ratio above 1", cfg: Config{SamplingRatio: ratio(1.5)}, want: []error{ErrSamplingRatio}, msgs: []string{"sampling_ratio: must be in [0, 1], got 1.5"}},
		{name: "ratio negative", cfg: Config{SamplingRatio: ratio(-0.1)}, want: []error{ErrSamplingRatio}},
		{name: "ratio NaN", cfg: Config{SamplingRatio: ratio(math.NaN())}, want: []error{ErrSamplingRatio}},
		{name: "resource key", cfg: Config{ResourceAttributes: map[string]string{" k": "v", "": "x"}}, want: []error{ErrResourceAttribute, ErrResourceAttribute}},
		{name: "timeout", cfg: Config{Timeout: -time.Second}, want: []error{ErrTimeout}},
		{name: "every problem at once", cfg: Config{Endpoint: "c:1", Protocol: "x", Headers: map[string]string{"a b": ""},
			SamplingRatio: ratio(2), Timeout: -1},
			want: []error{ErrProtocol, ErrEndpoint, ErrHeader, ErrSamplingRatio, ErrTimeout}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			var got []error
			if j, ok := err.(interface{ Unwrap() []error }); ok {
				got = j.Unwrap()
			}
			if len(got) != len(tt.want) {
				t.Fatalf("%d problems, want %d: %v", len(got), len(tt.want), err)
			}
			for i, e := range got {
				var fe *FieldError
				if !errors.As(e, &fe) || !errors.Is(e, tt.want[i]) {
					t.Errorf("problem %d %q: want a *FieldError wrapping %v", i, e, tt.want[i])
				}
			}
			for _, m := range tt.msgs {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error lacks %q: %v", m, err)
				}
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	var c Config
	if c.Enabled() || c.protocol() != ProtocolGRPC || c.samplingRatio() != 1 || c.timeout() != 10*time.Second {
		t.Errorf("zero Config: enabled %v, protocol %q, ratio %v, timeout %v", c.Enabled(), c.protocol(), c.samplingRatio(), c.timeout())
	}
	for in, want := range map[string]string{
		"http://c:4318":         "http://c:4318/v1/traces",
		"http://c:4318/":        "http://c:4318/v1/traces",
		"https://c/otlp/traces": "https://c/otlp/traces",
	} {
		if got := httpEndpoint(in); got != want {
			t.Errorf("httpEndpoint(%q) = %q, want %q", in, got, want)
		}
	}
}

package kvevents

import (
	"errors"
	"testing"
)

func TestExpandEndpoint(t *testing.T) {
	for _, tc := range []struct {
		template, url, want string
	}{
		{"tcp://{host}:5557", "http://10.0.0.7:8000", "tcp://10.0.0.7:5557"},
		{"tcp://{host}:5557", "http://[fd00::1]:8000", "tcp://[fd00::1]:5557"},
		{"tcp://{host}:{port}", "http://10.0.0.7:8000", "tcp://10.0.0.7:8000"},
		{"tcp://{host}:{port+50}", "http://127.0.0.1:23501", "tcp://127.0.0.1:23551"},
		{"tcp://127.0.0.1:{port-1}", "http://127.0.0.1:23501", "tcp://127.0.0.1:23500"},
		{"tcp://10.1.1.1:5557", "http://127.0.0.1:1", "tcp://10.1.1.1:5557"},
		{"tcp://{host}:{port}", "http://vllm.local", ""},        // no port to fill
		{"tcp://{host}:{port*2}", "http://127.0.0.1:1", ""},     // not an offset
		{"tcp://{host}:{port+70000}", "http://127.0.0.1:1", ""}, // out of range
		{"tcp://{host}:{port", "http://127.0.0.1:1", ""},
	} {
		got, err := ExpandEndpoint(tc.template, tc.url)
		if tc.want == "" {
			if !errors.Is(err, ErrEndpoint) {
				t.Errorf("ExpandEndpoint(%q, %q) = %q, %v; want ErrEndpoint", tc.template, tc.url, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ExpandEndpoint(%q, %q) = %q, %v; want %q", tc.template, tc.url, got, err, tc.want)
		}
	}
}

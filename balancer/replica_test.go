package balancer_test

import (
	"errors"
	"math"
	"testing"

	"github.com/gpurouter/gpurouter/balancer"
)

func TestNewReplica(t *testing.T) {
	tests := []struct {
		name     string
		cfg      balancer.ReplicaConfig
		wantErr  bool
		wantName string
		wantAddr string
		wantTLS  bool
		wantW    float64
	}{
		{name: "explicit port", cfg: balancer.ReplicaConfig{URL: "http://10.0.0.5:8000"}, wantName: "10.0.0.5:8000", wantAddr: "10.0.0.5:8000", wantW: 1},
		{name: "http default port", cfg: balancer.ReplicaConfig{URL: "http://vllm"}, wantName: "vllm:80", wantAddr: "vllm:80", wantW: 1},
		{name: "https default port", cfg: balancer.ReplicaConfig{URL: "https://vllm"}, wantName: "vllm:443", wantAddr: "vllm:443", wantTLS: true, wantW: 1},
		{name: "ipv6", cfg: balancer.ReplicaConfig{URL: "http://[::1]:8001"}, wantName: "[::1]:8001", wantAddr: "[::1]:8001", wantW: 1},
		{name: "name and weight", cfg: balancer.ReplicaConfig{Name: "a", URL: "http://h:1", Weight: 2.5}, wantName: "a", wantAddr: "h:1", wantW: 2.5},
		{name: "negative weight means 1", cfg: balancer.ReplicaConfig{URL: "http://h:1", Weight: -3}, wantName: "h:1", wantAddr: "h:1", wantW: 1},
		{name: "NaN weight", cfg: balancer.ReplicaConfig{URL: "http://h:1", Weight: math.NaN()}, wantErr: true},
		{name: "infinite weight", cfg: balancer.ReplicaConfig{URL: "http://h:1", Weight: math.Inf(1)}, wantErr: true},
		{name: "no scheme", cfg: balancer.ReplicaConfig{URL: "10.0.0.5:8000"}, wantErr: true},
		{name: "other scheme", cfg: balancer.ReplicaConfig{URL: "grpc://h:1"}, wantErr: true},
		{name: "no host", cfg: balancer.ReplicaConfig{URL: "http:///v1"}, wantErr: true},
		{name: "unparsable", cfg: balancer.ReplicaConfig{URL: "http://h:1/%zz"}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := balancer.NewReplica(tc.cfg, balancer.BreakerConfig{}, nil)
			if (err != nil) != tc.wantErr {
				t.Fatalf("NewReplica(%+v) error = %v, want error %v", tc.cfg, err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if r.Name() != tc.wantName || r.Addr() != tc.wantAddr || r.TLS() != tc.wantTLS || r.Weight() != tc.wantW {
				t.Errorf("got name %q addr %q tls %v weight %g, want %q %q %v %g",
					r.Name(), r.Addr(), r.TLS(), r.Weight(), tc.wantName, tc.wantAddr, tc.wantTLS, tc.wantW)
			}
			if r.URL() != tc.cfg.URL {
				t.Errorf("URL() = %q, want %q", r.URL(), tc.cfg.URL)
			}
			if !r.Healthy() || r.BreakerState() != "closed" || r.InFlight() != 0 {
				t.Errorf("new replica: healthy %v breaker %s in flight %d, want true closed 0", r.Healthy(), r.BreakerState(), r.InFlight())
			}
		})
	}
}

// TestLease covers the accounting around one request: in-flight while the
// lease is held, Served ever after, and an open breaker refusing Acquire.
func TestLease(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "a", c, replicaOpts{})
	l1, err := r.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	l2, err := r.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	if r.InFlight() != 2 || r.Served() != 2 {
		t.Fatalf("in flight %d served %d, want 2 2", r.InFlight(), r.Served())
	}
	l1.Done(nil)
	l2.Done(balancer.ErrNotReplicaFault)
	if r.InFlight() != 0 || r.Served() != 2 {
		t.Fatalf("in flight %d served %d after Done, want 0 2", r.InFlight(), r.Served())
	}
	balancer.Lease{}.Done(errors.New("x")) // the zero lease (failed Acquire) is a no-op

	openBreaker(t, r)
	if _, err := r.Acquire(); !errors.Is(err, balancer.ErrBreakerOpen) {
		t.Fatalf("Acquire on an open breaker: %v, want ErrBreakerOpen", err)
	}
	if r.InFlight() != 0 || r.Served() != 2+int64(testBreaker.ConsecutiveFailures) {
		t.Fatalf("refused Acquire counted: in flight %d served %d", r.InFlight(), r.Served())
	}
}

package tracing

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// otlpHTTP is a fake OTLP/HTTP receiver that keeps each export's path and
// headers and answers status.
type otlpHTTP struct {
	srv    *httptest.Server
	status int
	mu     sync.Mutex
	got    []http.Header
	paths  []string
}

func newOTLPHTTP(t *testing.T, status int) *otlpHTTP {
	o := &otlpHTTP{status: status}
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.got, o.paths = append(o.got, r.Header.Clone()), append(o.paths, r.URL.Path)
		o.mu.Unlock()
		w.WriteHeader(o.status)
	}))
	t.Cleanup(o.srv.Close)
	return o
}

func (o *otlpHTTP) exports() ([]http.Header, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.got, o.paths
}

// oneSpan ends one recorded request span through tr and flushes it.
func oneSpan(t *testing.T, tr *Tracer) error {
	t.Helper()
	tr.StartRequest(nil, RequestInfo{Method: "POST"}, time.Now()).End(time.Now(), Result{Status: 200})
	return tr.ForceFlush(context.Background())
}

// TestExportHTTPHeaders: configured headers go with every export, to the
// traces path an endpoint without one gets; without configured headers
// the standard environment variable's apply.
func TestExportHTTPHeaders(t *testing.T) {
	t.Run("configured", func(t *testing.T) {
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-from-env=1")
		o := newOTLPHTTP(t, http.StatusOK)
		tr, err := New(context.Background(), Config{Endpoint: o.srv.URL, Protocol: ProtocolHTTP,
			Headers: map[string]string{"Authorization": "Bearer s3cret", "X-Tenant": "a"}}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Shutdown(context.Background()) //nolint:errcheck
		if err := oneSpan(t, tr); err != nil {
			t.Fatal(err)
		}
		hs, paths := o.exports()
		if len(hs) != 1 || paths[0] != HTTPTracesPath {
			t.Fatalf("%d exports to %v", len(hs), paths)
		}
		if hs[0].Get("Authorization") != "Bearer s3cret" || hs[0].Get("X-Tenant") != "a" || hs[0].Get("X-From-Env") != "" {
			t.Errorf("headers %v: want the configured ones only", hs[0])
		}
	})
	t.Run("from the environment", func(t *testing.T) {
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "authorization=Bearer%20env")
		o := newOTLPHTTP(t, http.StatusOK)
		tr, err := New(context.Background(), Config{Endpoint: o.srv.URL + "/custom/path", Protocol: ProtocolHTTP}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Shutdown(context.Background()) //nolint:errcheck
		if err := oneSpan(t, tr); err != nil {
			t.Fatal(err)
		}
		hs, paths := o.exports()
		if len(hs) != 1 || paths[0] != "/custom/path" || hs[0].Get("Authorization") != "Bearer env" {
			t.Fatalf("exports to %v with %v", paths, hs)
		}
	})
}

// TestExportErrorReported: a failed export reaches OnExportError, with the
// spans dropped, and not the SDK's process-wide handler.
func TestExportErrorReported(t *testing.T) {
	o := newOTLPHTTP(t, http.StatusBadRequest) // not retried: the batch is dropped at once
	var mu sync.Mutex
	var errs []error
	var dropped int
	tr, err := New(context.Background(), Config{Endpoint: o.srv.URL, Protocol: ProtocolHTTP}, Options{
		OnExportError: func(err error, spans int) {
			mu.Lock()
			defer mu.Unlock()
			errs, dropped = append(errs, err), dropped+spans
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown(context.Background()) //nolint:errcheck
	if err := oneSpan(t, tr); err != nil {
		t.Fatalf("flush: %v (the error goes to OnExportError)", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 1 || dropped != 1 {
		t.Errorf("reported %v, %d spans dropped; want one error, one span", errs, dropped)
	}
}

// TestShutdownBounded: with the receiver gone, Shutdown returns by its
// context's deadline, and by the configured timeout when it has none.
func TestShutdownBounded(t *testing.T) {
	// A port that accepts connections and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for _, proto := range Protocols {
		t.Run(string(proto), func(t *testing.T) {
			for name, ctxTimeout := range map[string]time.Duration{"ctx deadline": 200 * time.Millisecond, "config timeout": 0} {
				tr, err := New(context.Background(), Config{Endpoint: "http://" + ln.Addr().String(), Protocol: proto,
					Timeout: 300 * time.Millisecond}, Options{OnExportError: func(error, int) {}})
				if err != nil {
					t.Fatal(err)
				}
				tr.StartRequest(nil, RequestInfo{}, time.Now()).End(time.Now(), Result{})
				ctx := context.Background()
				if ctxTimeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, ctxTimeout)
					defer cancel()
				}
				start := time.Now()
				err = tr.Shutdown(ctx)
				if d := time.Since(start); d > 5*time.Second {
					t.Errorf("%s: Shutdown took %v", name, d)
				}
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Logf("%s: %v", name, err) // the exporter's own timeout may say it first
				}
			}
		})
	}
}

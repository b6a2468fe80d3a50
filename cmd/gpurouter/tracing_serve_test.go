package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/tracing/otelcoltest"
)

// TestServeExportsTraces: `serve` with a tracing section exports each
// request's spans to the OTLP receiver it names (a real Collector), under
// the client's trace, and the spans of the requests served before a
// shutdown are exported by it (the drain, then the Tracer's flush).
func TestServeExportsTraces(t *testing.T) {
	col := otelcoltest.Start(t)
	fleet := startSimFleet(t, 1, nil)
	ratio := 1.0
	cfg := fileConfig{Log: logConfig{Level: "error"},
		Pools:   []poolConfig{{Model: "m", Replicas: []replicaConfig{{Name: "r0", URL: fleet.URLs()[0]}}}},
		Tracing: tracingConfig{Endpoint: col.HTTPEndpoint, Protocol: "http", SamplingRatio: &ratio}}
	url, stop := runConfiguredRouter(t, cfg)

	const traceID, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"hello","max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+parent+"-01")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	stop() // as SIGTERM: the drain, then the spans are flushed
	spans := col.WaitForSpans(t, 30*time.Second, func(s []otelcoltest.Span) bool {
		for _, sp := range s {
			if sp.TraceID == traceID && sp.Name == "POST /v1/completions" {
				return true
			}
		}
		return false
	})
	var root, attempt *otelcoltest.Span
	for i, s := range spans {
		switch {
		case s.TraceID != traceID:
		case s.Name == "POST /v1/completions":
			root = &spans[i]
		case s.Name == "text_completion m":
			attempt = &spans[i]
		}
	}
	if root == nil || attempt == nil || root.ParentSpanID != parent || root.Resource["service.name"] != "gpurouter" {
		t.Fatalf("the request's spans:\n%s", otelcoltest.Describe(spans))
	}
	tcs := fleet.Replicas()[0].TraceContexts()
	if len(tcs) != 1 || tcs[0].Traceparent != "00-"+traceID+"-"+attempt.SpanID+"-01" {
		t.Errorf("the engine got %+v, want the attempt %s as parent", tcs, attempt.SpanID)
	}
}

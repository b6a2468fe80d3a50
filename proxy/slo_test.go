package proxy

import (
	"io"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
)

// A request with a TTFT objective that waits at the router while every
// replica is saturated is shed with 429 + Retry-After once it can no longer
// meet it — not served late, and not refused at once on a guess; one whose
// header is malformed is refused with 400 before it queues.
func TestSLODeadlineShedsQueuedRequest(t *testing.T) {
	up := newFakeVLLM(t)
	tr := startRouterWith(t, []string{up.url}, func(o *Options) {
		ctl, err := admission.New("m", admission.Config{}, admission.Deps{Pool: o.Routes[0].Pool})
		if err != nil {
			t.Fatal(err)
		}
		o.Routes[0].Admission = ctl
	}, withPolicy("predictive"))
	// Saturated: requests wait in the engine's queue (never stale: an hour ahead).
	tr.reps[0].SetEngineLoad(balancer.EngineLoad{Running: 8, Waiting: 3, KVCapacityTokens: 30000, At: time.Now().Add(time.Hour)})
	// One in flight, so the queue is not bypassed as an empty pool's would be.
	held, err := tr.reps[0].Acquire()
	if err != nil {
		t.Fatal(err)
	}
	defer held.Done(nil)

	start := time.Now()
	resp := post(t, tr.url+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":4}`, "X-Gpurouter-Slo-Ttft", "300ms")
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	waited := time.Since(start)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// It waited for its deadline (300 ms less its prefill), not refused at once.
	if waited < 100*time.Millisecond {
		t.Errorf("shed after %v: before its deadline", waited)
	}
	if n := up.requests.Load(); n != 0 {
		t.Errorf("engine got %d requests, want 0", n)
	}

	resp = post(t, tr.url+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":4}`, "X-Gpurouter-Slo-Ttft", "soon")
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("malformed SLO header: status %d, want 400", resp.StatusCode)
	}
}

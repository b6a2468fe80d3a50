package sim

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// checkTooManyRequests asserts a refusal as a client reads it: 429, the
// Retry-After header (absent when retryAfter is ""), and vLLM's error
// document.
func checkTooManyRequests(t *testing.T, code int, hdr http.Header, body []byte, retryAfter string) {
	t.Helper()
	if code != 429 {
		t.Fatalf("status %d %s, want 429", code, body)
	}
	if got, ok := hdr["Retry-After"]; retryAfter == "" && ok || retryAfter != "" && hdr.Get("Retry-After") != retryAfter {
		t.Errorf("Retry-After = %q, want %q", got, retryAfter)
	}
	var e struct {
		Error struct {
			Message *string         `json:"message"`
			Type    *string         `json:"type"`
			Param   json.RawMessage `json:"param"`
			Code    *int            `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	if m := e.Error; m.Message == nil || *m.Message == "" || m.Type == nil || *m.Type != "RateLimitError" ||
		string(m.Param) != "null" || m.Code == nil || *m.Code != 429 {
		t.Errorf("error body %s, want vLLM's {\"error\":{\"message\",\"type\":\"RateLimitError\",\"param\":null,\"code\":429}}", body)
	}
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
}

func TestFaultMaxWaitingQueueLength(t *testing.T) {
	p := mustBuiltin(t, "qwen2.5-7b")
	p.Engine.MaxNumSeqs = 1 // one runs, the rest wait
	f := startFleet(t, FleetConfig{Replicas: 1, Profiles: []Profile{p}, Speeds: []float64{10},
		ServedModelNames: []string{"qwen"}, Faults: Faults{MaxWaitingQueueLength: 2, RetryAfterSeconds: 7}})
	r, u := f.Replicas()[0], f.URLs()[0]

	long := openStream(t, u, "/v1/completions", `{"model":"qwen","stream":true,"prompt":"x","max_tokens":20000,"ignore_eos":true}`)
	defer long.close()
	long.readHeader(t)
	if long.next(t) == "" {
		t.Fatal("the long request did not start")
	}
	// Each of these arrives while the queue has room, and is queued.
	small := `{"model":"qwen","stream":true,"prompt":"x","max_tokens":3,"ignore_eos":true}`
	for want := 1; want <= 2; want++ {
		s := openStream(t, u, "/v1/completions", small)
		defer s.close()
		waitFor(t, 5*time.Second, "request queued", func() bool { return r.State().Waiting == want })
	}

	for _, c := range []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", smallChat},
		{"streamed completion", "/v1/completions", small},
	} {
		t.Run("full/"+c.name, func(t *testing.T) {
			code, hdr, body := httpDo(t, "POST", u+c.path, c.body)
			checkTooManyRequests(t, code, hdr, body, "7")
			if st := r.State(); st.Waiting != 2 || st.Running != 1 {
				t.Errorf("engine after a refusal: %+v, want 1 running and 2 waiting", st)
			}
		})
	}

	// The long request leaves, the queue drains, and requests are served.
	long.close()
	waitFor(t, 5*time.Second, "queue drained", func() bool { st := r.State(); return st.Waiting == 0 && st.Running == 0 })
	if code, _, body := httpDo(t, "POST", u+"/v1/chat/completions", smallChat); code != 200 {
		t.Errorf("with room in the queue: %d %s", code, body)
	}
}

func TestFaultRateLimited(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	cases := []struct{ name, faults, retryAfter string }{
		{"configured Retry-After", `{"rate_limited":true,"retry_after_seconds":3}`, "3"},
		{"default Retry-After", `{"rate_limited":true}`, "1"},
		{"no Retry-After", `{"rate_limited":true,"retry_after_seconds":-1}`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			setFaults(t, u, c.faults)
			code, hdr, body := httpDo(t, "POST", u+"/v1/chat/completions", smallChat)
			checkTooManyRequests(t, code, hdr, body, c.retryAfter)
			code, hdr, body = httpDo(t, "POST", u+"/v1/completions", `{"model":"qwen","stream":true,"prompt":"x","max_tokens":3}`)
			checkTooManyRequests(t, code, hdr, body, c.retryAfter)
			if code, _, _ := httpDo(t, "GET", u+"/health", ""); code != 200 {
				t.Errorf("/health of a refusing replica = %d, want 200", code)
			}
		})
	}
	setFaults(t, u, `{}`)
	if code, _, body := httpDo(t, "POST", u+"/v1/chat/completions", smallChat); code != 200 {
		t.Errorf("after clearing: %d %s", code, body)
	}
	for _, bad := range []string{`{"retry_after_seconds":-2}`, `{"max_waiting_queue_length":-1}`,
		`{"keepalive_timeout_seconds":-1}`, `{"crash_every_seconds":-1}`} {
		if code, _, _ := httpDo(t, "POST", u+"/sim/faults", bad); code != 400 {
			t.Errorf("POST %s = %d, want 400", bad, code)
		}
	}
}

package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The admin API's answers, and its end: Run returns once its context
// ends, even with a client holding a keep-alive connection open.
func TestAdmin(t *testing.T) {
	f, _ := newFleet(t, onePool(Replica{Name: "a", URL: "http://127.0.0.1:1"}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const token = "admin-token-0123456789"
	var reloads atomic.Int32
	a := NewAdmin(f, ln, AdminOptions{
		Token:         token,
		Reload:        func() error { reloads.Add(1); return errors.New("no file") },
		Render:        func(s Spec) (string, error) { return "pools: " + s.Pools[0].Model, nil },
		Active:        func() int64 { return 7 },
		ShutdownGrace: 50 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	base := "http://" + ln.Addr().String()
	client := &http.Client{} // keeps its connection open between calls
	call := func(method, path, tok, body string) (int, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		name, method, path, token, body string
		status                          int
		inBody                          string
	}{
		{"no token", "GET", "/admin/state", "", "", 401, "admin token"},
		{"state", "GET", "/admin/state", token, "", 200, `"config_yaml": "pools: m"`},
		{"add", "POST", "/admin/pools/m/replicas", token, `{"url":"http://127.0.0.1:2","name":"b"}`, 200, "applied"},
		{"add again", "POST", "/admin/pools/m/replicas", token, `{"url":"http://127.0.0.1:3","name":"b"}`, 400, "already used"},
		{"bad body", "POST", "/admin/pools/m/replicas", token, `{`, 400, "body"},
		{"drain", "POST", "/admin/pools/m/replicas/b/drain", token, "", 200, "drained b"},
		{"drain unknown", "POST", "/admin/pools/m/replicas/zz/drain", token, "", 404, "no replica"},
		{"remove", "DELETE", "/admin/pools/m/replicas/a", token, "", 200, "applied"},
		{"remove unknown", "DELETE", "/admin/pools/m/replicas/a", token, "", 404, "no such replica"},
		{"unknown pool", "PUT", "/admin/pools/z/policy", token, `{"policy":"p2c"}`, 404, "no such pool"},
		{"arms", "PUT", "/admin/pools/m/policy", token, `{"arms":[{"name":"x","policy":"p2c"},{"name":"y","policy":"round_robin","share":2}]}`, 200, "applied"},
		{"reload error", "POST", "/admin/reload", token, "", 400, "no file"},
		{"no route", "GET", "/admin/nope", token, "", 404, "no admin route"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, body := call(tt.method, tt.path, tt.token, tt.body)
			if st != tt.status || !strings.Contains(body, tt.inBody) {
				t.Fatalf("%d %s, want %d with %q", st, body, tt.status, tt.inBody)
			}
		})
	}
	_, body := call("GET", "/admin/state", token, "")
	var state struct {
		Pools []struct {
			Policy   string
			Replicas []struct {
				Name     string
				Draining bool
			}
		}
		Active int64 `json:"active_requests"`
	}
	if err := json.Unmarshal([]byte(body), &state); err != nil {
		t.Fatal(err)
	}
	p := state.Pools[0]
	if len(p.Replicas) != 1 || p.Replicas[0].Name != "b" || !p.Replicas[0].Draining || !strings.HasPrefix(p.Policy, "experiment(") || state.Active != 7 || reloads.Load() != 1 {
		t.Fatalf("state after the edits: %s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return with a client's connection open")
	}
}

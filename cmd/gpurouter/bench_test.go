package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// sseUpstream is a tiny vLLM-like completions server on loopback: it
// streams max_tokens chunks, gap(arm) apart, where arm is the request's
// X-Gpurouter-Policy header, then usage and [DONE].
type sseUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	arms map[string]int // requests seen per arm header value
}

func startSSEUpstream(t *testing.T, gap func(arm string) time.Duration) *sseUpstream {
	t.Helper()
	u := &sseUpstream{arms: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","object":"model"}]}`)
			return
		}
		var body struct {
			MaxTokens int `json:"max_tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.MaxTokens < 1 {
			http.Error(w, `{"error":{"message":"bad body"}}`, http.StatusBadRequest)
			return
		}
		arm := r.Header.Get("X-Gpurouter-Policy")
		u.mu.Lock()
		u.arms[arm]++
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := range body.MaxTokens {
			if i > 0 {
				time.Sleep(gap(arm))
			}
			fmt.Fprint(w, `data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}`+"\n\n")
			fl.Flush()
		}
		fmt.Fprintf(w, `data: {"id":"cmpl-1","object":"text_completion","choices":[],"usage":{"prompt_tokens":8,"total_tokens":%d,"completion_tokens":%d}}`+"\n\n", 8+body.MaxTokens, body.MaxTokens)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *sseUpstream) seen(arm string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.arms[arm]
}

// smallWorkload are flags for a fast, deterministic workload.
func smallWorkload(n int) []string {
	return []string{"--model", "fake-model", "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "4",
		"--ignore-eos", "--num-prompts", fmt.Sprint(n), "--seed", "1", "--disable-tqdm"}
}

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestBenchSweepTwoTargets(t *testing.T) {
	fast := startSSEUpstream(t, func(string) time.Duration { return time.Millisecond })
	slow := startSSEUpstream(t, func(string) time.Duration { return 40 * time.Millisecond })
	dir := filepath.Join(t.TempDir(), "sweep-report")
	args := append([]string{"bench", "sweep", "--request-rates", "200,inf",
		"--targets", "slow=" + slow.URL + ",fast=" + fast.URL,
		"--slo", "loose=tpot:500", "--slo", "tight=ttft:1000,tpot:20", "--report", dir}, smallWorkload(4)...)
	code, out, errOut := runCmd(t, args...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{
		"slow @ 200 req/s: 4 ok, 0 failed",
		"fast @ inf req/s: 4 ok, 0 failed",
		"| target | rate (req/s) | completed | failed |",
		"**SLO compliance: tight (judged at P99)**",
		"| rate (req/s) | slow | fast |",
		"| 200 | FAIL (TPOT) | PASS |",
		"| inf | FAIL (TPOT) | PASS |",
		"| 200 | PASS | PASS |",
		"**Max SLO-compliant rate: tight**",
		"| slow | none | - | - |",
		"Winner: **fast** at inf req/s.",
		"**Max SLO-compliant rate: loose**",
		"Winner: **fast** at inf req/s; tied on rate with slow, ahead on output tok/s.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# gpurouter rate sweep", "## Rate sweep", "(capacity)", "](slo_matrix_2.png)"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, png := range []string{"throughput_vs_rate.png", "slo_matrix_1.png", "slo_matrix_2.png"} {
		if fi, err := os.Stat(filepath.Join(dir, png)); err != nil || fi.Size() < 1000 {
			t.Errorf("%s: %v", png, err)
		}
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", out, errOut)
	}
}

func TestBenchABArms(t *testing.T) {
	up := startSSEUpstream(t, func(arm string) time.Duration {
		if arm == "slow" {
			return 25 * time.Millisecond
		}
		return time.Millisecond
	})
	dir := filepath.Join(t.TempDir(), "ab-report")
	args := append([]string{"bench", "ab", "--base-url", up.URL, "--arms", "slow,fast", "--bootstrap-resamples", "300", "--report", dir}, smallWorkload(16)...)
	code, out, errOut := runCmd(t, args...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if up.seen("slow") != 16 || up.seen("fast") != 16 || up.seen("") != 0 {
		t.Fatalf("arms seen: slow %d fast %d none %d", up.seen("slow"), up.seen("fast"), up.seen(""))
	}
	for _, want := range []string{
		"A/B: A = slow (" + up.URL + ", X-Gpurouter-Policy: slow), B = fast",
		"Side slow", "Side fast", "Serving Benchmark Result",
		"A = **slow**, B = **fast**",
		"300 paired bootstrap resamples of requests (seed 1)",
		"| metric | slow (ms) | fast (ms) | Δ B−A (ms) | Δ % | 95% CI of Δ (ms) | verdict |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "| P50 TPOT |") || strings.HasPrefix(line, "| P50 E2EL |") {
			if !strings.HasSuffix(line, "| significant: B lower |") {
				t.Errorf("want a significant drop: %s", line)
			}
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil || !strings.Contains(string(md), "## A/B comparison") || !strings.Contains(string(md), "(ab): A/B: fast vs slow differs significantly") {
		t.Errorf("report: %v\n%s", err, md)
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", out, errOut)
	}
}

func TestBenchABTargetsAndPlainReport(t *testing.T) {
	a := startSSEUpstream(t, func(string) time.Duration { return time.Millisecond })
	b := startSSEUpstream(t, func(string) time.Duration { return time.Millisecond })
	args := append([]string{"bench", "ab", "--targets", "one=" + a.URL, "--targets", "two=" + b.URL, "--bootstrap-resamples", "50"}, smallWorkload(3)...)
	if code, out, errOut := runCmd(t, args...); code != 0 || !strings.Contains(out, "A = **one**, B = **two**") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if a.seen("") != 3 || b.seen("") != 3 {
		t.Fatalf("requests: %d and %d", a.seen(""), b.seen(""))
	}

	dir := filepath.Join(t.TempDir(), "plain")
	args = append([]string{"bench", "--base-url", a.URL, "--report", dir}, smallWorkload(3)...)
	code, out, errOut := runCmd(t, args...)
	if code != 0 || !strings.Contains(out, "============ Serving Benchmark Result ============") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil || !strings.Contains(string(md), "## Summary") || !strings.Contains(string(md), "](latency_percentiles.png)") {
		t.Fatalf("report: %v\n%s", err, md)
	}
}

func TestBenchSubcommandFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"sweep without rates", []string{"bench", "sweep"}, "--request-rates is required"},
		{"sweep with a single rate flag", []string{"bench", "sweep", "--request-rates", "1", "--request-rate", "2"}, "not --request-rate"},
		{"sweep bad rate", []string{"bench", "sweep", "--request-rates", "1,x"}, `"x" is not a positive rate`},
		{"sweep bad target", []string{"bench", "sweep", "--request-rates", "1", "--targets", "nourl"}, "want LABEL=http(s)://HOST:PORT"},
		{"sweep duplicate label", []string{"bench", "sweep", "--request-rates", "1", "--targets", "a=http://x:1,a=http://y:1"}, `label "a" given twice`},
		{"sweep bad slo", []string{"bench", "sweep", "--request-rates", "1", "--slo", "fast=ttft"}, `--slo "fast=ttft"`},
		{"ab one side", []string{"bench", "ab", "--targets", "a=http://x:1"}, "needs two sides"},
		{"ab three arms", []string{"bench", "ab", "--arms", "a,b,c"}, "compares two sides"},
		{"ab same arm", []string{"bench", "ab", "--arms", "a,a"}, "the two arms are the same"},
		{"ab bad confidence", []string{"bench", "ab", "--arms", "a,b", "--confidence", "95"}, "--confidence 95"},
		{"plain still validates", []string{"bench", "--num-prompts", "0"}, "--num-prompts 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := runCmd(t, tt.args...)
			if code != 2 || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant %q", code, errOut, tt.want)
			}
		})
	}
}

package proxycost

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// The command name holds a space and a parenthesis.
	line := []byte("4242 (my (proc) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 8 0 100 0 0\n")
	got, err := parseStatCPU(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 325 * clockTick; got != want {
		t.Fatalf("cpu = %s, want %s", got, want)
	}
	if _, err := parseStatCPU([]byte("4242 (x) S 1")); err == nil {
		t.Fatal("short line: no error")
	}
}

func TestParseRSSAndBusy(t *testing.T) {
	rss, err := parseRSS([]byte("Name:\tx\nVmPeak:\t 9000 kB\nVmRSS:\t    1536 kB\n"))
	if err != nil || rss != 1536<<10 {
		t.Fatalf("rss = %d, %v", rss, err)
	}
	busy, err := parseBoxBusy([]byte("cpu  100 5 30 9999 7 1 2 3 0 0\ncpu0 1 2 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (100 + 5 + 30 + 1 + 2 + 3) * clockTick; busy != want {
		t.Fatalf("busy = %s, want %s (idle and iowait left out)", busy, want)
	}
}

func TestOwnProcessIsMeasurable(t *testing.T) {
	m, err := startCPU(nil)
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	if _, _, _, err := m.stop(); err != nil {
		t.Fatal(err)
	}
}

func TestEventStampRoundTrip(t *testing.T) {
	ev := appendEvent(nil, 1234567890123)
	if !bytes.HasSuffix(ev, []byte("\n\n")) || len(ev) < 150 {
		t.Fatalf("event %q", ev)
	}
	line, _, _ := bytes.Cut(ev, []byte("\n"))
	got, ok := eventStamp(line)
	if !ok || got != 1234567890123 {
		t.Fatalf("stamp = %d, %v", got, ok)
	}
	for _, l := range []string{"data: [DONE]", "", `data: {"id":"chatcmpl-proxycost","choices":[]}`} {
		if _, ok := eventStamp([]byte(l)); ok {
			t.Fatalf("%q read as a stamped event", l)
		}
	}
	for _, n := range []int{300, 500, 8192} {
		for _, stream := range []bool{false, true} {
			req := chatRequest(n, stream)
			if len(req) != n || !json.Valid(req) || bytes.Contains(req, []byte(`"stream":true`)) != stream {
				t.Fatalf("chatRequest(%d, %v): %d B, valid %v: %s", n, stream, len(req), json.Valid(req), req)
			}
		}
		if r := chatReply(n); len(r) != n || !json.Valid(r) || !bytes.HasSuffix(r, replyEnd) {
			t.Fatalf("chatReply(%d): %d B, valid %v", n, len(r), json.Valid(r))
		}
	}
	// Smaller than their fields: the fields alone, still JSON.
	if r := chatRequest(10, false); !json.Valid(r) || len(r) < 10 {
		t.Fatalf("chatRequest(10): %s", r)
	}
}

func TestExternalTarget(t *testing.T) {
	tg, err := ExternalTarget("envoy=127.0.0.1:10000,pid=77")
	if err != nil || tg.Name != "envoy" || tg.Addr != "127.0.0.1:10000" || len(tg.PIDs) != 1 || tg.PIDs[0] != 77 {
		t.Fatalf("%+v, %v", tg, err)
	}
	for _, bad := range []string{"x", "=a:1", "x=a:1,pid=no", "x=a:1,77"} {
		if _, err := ExternalTarget(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

func TestMedianAndPercentile(t *testing.T) {
	if m := medianOf([]float64{3, 1, 2}); m != 2 {
		t.Fatalf("median %v", m)
	}
	if m := medianOf([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Fatalf("median %v", m)
	}
	d := []time.Duration{5, 1, 4, 2, 3}
	if p := percentile(d, 0.5); p != 3 {
		t.Fatalf("p50 %v", p)
	}
	if d[0] != 5 {
		t.Fatal("percentile sorted its input")
	}
}

// TestRunDirectTiny runs the whole harness, tiny, against direct only: the
// upstream, both closed loops and the SSE clients on loopback. It checks
// that every figure was measured, not how fast anything was.
func TestRunDirectTiny(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var progress bytes.Buffer
	res, err := Run(ctx, Config{
		Reps: 2, Duration: 200 * time.Millisecond, C1Duration: 100 * time.Millisecond,
		Concurrency: 4, Streams: 4, Events: 10, Warmup: 100 * time.Millisecond,
		Retries: -1, Progress: &progress, RequestBytes: 2048, ReplyBytes: 1024,
	})
	if err != nil {
		t.Fatal(err)
	}
	fs := res.Figures()
	if len(fs) != 1 || fs[0].Name != "direct" || fs[0].Measured {
		t.Fatalf("figures %+v", fs)
	}
	d := fs[0]
	if d.P50C1us <= 0 || d.ReqPerSec <= 0 || d.SSEDelayP50us <= 0 || d.InterArrivalMs <= 0 {
		t.Fatalf("unmeasured figures: %+v\n%s", d, progress.String())
	}
	if res.Runs != 2*3 {
		t.Fatalf("%d runs, want 6 (2 reps × c=1, c=64, sse; no retries)", res.Runs)
	}
	var out bytes.Buffer
	res.WriteMarkdown(&out)
	for _, want := range []string{"| | direct |", "proxy CPU per request", "extra RSS per idle stream", "6 runs", "requests 2048 B, replies 1024 B"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("report lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := res.WriteJSON(&out); err != nil {
		t.Fatal(err)
	}
	var j struct {
		RequestBytes int `json:"request_bytes"`
		ReplyBytes   int `json:"reply_bytes"`
	}
	if err := json.Unmarshal(out.Bytes(), &j); err != nil || j.RequestBytes != 2048 || j.ReplyBytes != 1024 {
		t.Fatalf("JSON body sizes %+v (%v):\n%s", j, err, out.String())
	}
}

// fakeTarget is a TargetResult with one sample per workload.
func fakeTarget(name string, measured bool, c1, cpuReq, cpuEv, gap time.Duration, rss float64) *TargetResult {
	t := &TargetResult{Name: name, measured: measured}
	t.add("c=1", &sample{count: 100, elapsed: time.Second, p50: c1})
	t.add("c=64", &sample{count: 1000, elapsed: time.Second, proxyCPU: 1000 * cpuReq})
	t.add("sse", &sample{count: 1000, elapsed: time.Second, p50: c1, gapP50: gap, proxyCPU: 1000 * cpuEv})
	if measured {
		t.idleRSS = []float64{rss}
	}
	return t
}

func TestAcceptanceJudgesEachGpurouterColumn(t *testing.T) {
	us := time.Microsecond
	r := &Result{Config: Config{}.withDefaults(), Targets: []*TargetResult{
		fakeTarget("direct", false, 100*us, 0, 0, 5000*us, 0),
		fakeTarget("gpurouter", true, 210*us, 30*us, 9*us, 5200*us, 20),
		fakeTarget("gpurouter-p1", true, 200*us, 20*us, 12*us, 5800*us, 10),
		fakeTarget("haproxy", true, 190*us, 15*us, 8*us, 5000*us, 5),
		fakeTarget("nginx", true, 200*us, 14*us, 10*us, 5000*us, 16),
	}}
	got := strings.Join(r.Acceptance(), "\n")
	for _, want := range []string{
		"FAIL gpurouter 1. CPU per request 30.0 µs = 2.00× HAProxy's 15.0",
		"PASS gpurouter 2. CPU per event 9.0 µs = 0.90× nginx's 10.0",
		"PASS gpurouter 2. inter-arrival p50 5.20 ms, +4.0%",
		"FAIL gpurouter 3. RSS per idle stream 20.0 KiB vs nginx's 16.0 (≤ nginx's); 4.0× HAProxy's 5.0",
		"PASS gpurouter 4. added p50 at c=1 +110 µs = 1.10× nginx's +100 (≤ 1.2×)",
		"PASS gpurouter-p1 1. CPU per request 20.0 µs = 1.33×",
		"FAIL gpurouter-p1 2. CPU per event 12.0 µs = 1.20×",
		"FAIL gpurouter-p1 2. inter-arrival p50 5.80 ms, +16.0%",
		"PASS gpurouter-p1 3. RSS per idle stream 10.0 KiB",
		"PASS gpurouter-p1 4. added p50 at c=1 +100 µs = 1.00×",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("acceptance lacks %q:\n%s", want, got)
		}
	}
}

func TestReferenceJudgesTheOtherProxiesNotThemselves(t *testing.T) {
	us := time.Microsecond
	r := &Result{Config: Config{}.withDefaults(), Targets: []*TargetResult{
		fakeTarget("direct", false, 100*us, 0, 0, 5000*us, 0),
		fakeTarget("gpurouter", true, 210*us, 30*us, 9*us, 5200*us, 20),
		fakeTarget("epoll-bare", true, 250*us, 12*us, 9*us, 5100*us, 1),
		fakeTarget("haproxy", true, 190*us, 15*us, 8*us, 5000*us, 5),
		fakeTarget("nginx", true, 200*us, 14*us, 10*us, 5000*us, 16),
	}}
	got := strings.Join(r.Reference(), "\n")
	for _, want := range []string{
		"PASS epoll-bare 1. CPU per request 12.0 µs = 0.80× HAProxy's 15.0",
		"FAIL epoll-bare 4. added p50 at c=1 +150 µs = 1.50× nginx's +100",
		"PASS haproxy 2. CPU per event 8.0 µs = 0.80× nginx's 10.0",
		"PASS haproxy 3. RSS per idle stream 5.0 KiB vs nginx's 16.0 (≤ nginx's)\n",
		"PASS haproxy 4. added p50 at c=1 +90 µs = 0.90× nginx's +100",
		"PASS nginx 2. inter-arrival p50 5.00 ms, +0.0%",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("reference lacks %q:\n%s", want, got)
		}
	}
	for _, never := range []string{"gpurouter", "S direct", "L direct", "haproxy 1.", "nginx 2. CPU", "nginx 3.", "nginx 4."} {
		if strings.Contains(got, never) {
			t.Errorf("reference has %q:\n%s", never, got)
		}
	}
	if acc := strings.Join(r.Acceptance(), "\n"); strings.Contains(acc, "haproxy 4.") || strings.Contains(acc, "epoll-bare") {
		t.Errorf("acceptance judges a reference proxy:\n%s", acc)
	}
	var out strings.Builder
	r.WriteMarkdown(&out)
	if !strings.Contains(out.String(), "the same rules on the other proxies (for scale, not judged):\n  PASS epoll-bare 1.") {
		t.Errorf("report lacks the reference section:\n%s", out.String())
	}
}

// TestRunOneWorkload runs the harness, tiny, at c=1 alone: one run a rep,
// and a report with the c=1 row and none of the others.
func TestRunOneWorkload(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		Reps: 3, C1Duration: 100 * time.Millisecond, Concurrency: 4, Streams: 4, Events: 10,
		Warmup: 100 * time.Millisecond, Retries: -1, Workloads: []string{"c1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Runs != 3 {
		t.Fatalf("%d runs, want 3 (3 reps × c=1)", res.Runs)
	}
	d := res.Figures()[0]
	if d.P50C1us <= 0 || d.ReqPerSec != 0 || d.SSEDelayP50us != 0 {
		t.Fatalf("figures %+v: want c=1's alone", d)
	}
	var out bytes.Buffer
	res.WriteMarkdown(&out)
	report := out.String()
	if !strings.Contains(report, "| added p50 at c=1") || !strings.Contains(report, "; workloads c1 only") {
		t.Fatalf("report lacks the c=1 row or the heading's workloads:\n%s", report)
	}
	for _, never := range []string{"proxy CPU per request", "req/s", "SSE", "extra RSS"} {
		if strings.Contains(report, never) {
			t.Errorf("report has %q, a workload not measured:\n%s", never, report)
		}
	}
	out.Reset()
	if err := res.WriteJSON(&out); err != nil {
		t.Fatal(err)
	}
	var j struct {
		Workloads []string `json:"workloads"`
	}
	if err := json.Unmarshal(out.Bytes(), &j); err != nil || strings.Join(j.Workloads, ",") != "c1" {
		t.Errorf("JSON workloads %q (%v):\n%s", j.Workloads, err, out.String())
	}
	if _, err := Run(ctx, Config{Workloads: []string{"c2"}}); err == nil {
		t.Error("Run took an unknown workload")
	}
}

func TestParseWorkloads(t *testing.T) {
	for in, want := range map[string]string{
		"c1":              "c1",
		" c1 , sse":       "c1 sse",
		"idle,c1,idle":    "idle c1",
		"c1,c64,sse,idle": "c1 c64 sse idle",
	} {
		got, err := ParseWorkloads(in)
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("ParseWorkloads(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "c2", "c1,", "c1;sse"} {
		if got, err := ParseWorkloads(bad); err == nil {
			t.Errorf("ParseWorkloads(%q) = %q, want an error", bad, got)
		}
	}
}

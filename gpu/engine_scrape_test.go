package gpu

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestEngineScraperErrors(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			if r.Header.Get("Accept") == "" {
				t.Error("no Accept header")
			}
			w.Write(readTestdata(t, "vllm_v1.txt"))
		case "/garbage/metrics":
			w.Write(readTestdata(t, "garbage.txt"))
		case "/hang/metrics":
			<-release
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	defer close(release)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	refused := "http://" + ln.Addr().String()
	ln.Close()

	for _, tc := range []struct {
		name    string
		url     string
		timeout time.Duration
		wantErr error
	}{
		{"ok, base URL", srv.URL, time.Second, nil},
		{"ok, full URL", srv.URL + "/metrics", time.Second, nil},
		{"404", srv.URL + "/nope/metrics", time.Second, ErrHTTPStatus},
		{"not vLLM", srv.URL + "/garbage/metrics", time.Second, ErrNoEngineMetrics},
		{"slow replica hits the timeout", srv.URL + "/hang/metrics", 50 * time.Millisecond, context.DeadlineExceeded},
		{"connection refused", refused, time.Second, errAny},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := NewEngineScraper(tc.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			s, err := sc.Fetch(ctx)
			switch {
			case tc.wantErr == nil && (err != nil || s.Running != 8):
				t.Errorf("stats %+v err %v", s, err)
			case tc.wantErr == errAny && err == nil:
				t.Error("no error")
			case tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
		})
	}
	sc, _ := NewEngineScraper(srv.URL, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := sc.Fetch(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if _, err := NewEngineScraper("10.0.0.1:8000", nil); err == nil {
		t.Error("URL without scheme accepted")
	}
}

// errAny marks a case where any error will do.
var errAny = errors.New("any error")

// Every engine is read from its own /metrics, detected or configured; a
// replica without metrics enabled (404, 501) exposes no engine metrics,
// which the poller backs off, while other statuses are plain failures.
func TestEngineScraperEngines(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sglang/metrics":
			w.Write(readTestdata(t, "sglang.txt"))
		case "/llamacpp/metrics":
			w.Write(readTestdata(t, "llamacpp.txt"))
		case "/tgi/metrics":
			w.Write(readTestdata(t, "tgi.txt"))
		case "/no-metrics-flag/metrics": // llama-server without --metrics
			http.Error(w, `{"error":{"code":501,"message":"This server does not support metrics endpoint.","type":"not_supported_error"}}`,
				http.StatusNotImplemented)
		case "/broken/metrics":
			http.Error(w, "boom", http.StatusInternalServerError)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close) // after the parallel subtests, unlike a defer
	for _, tc := range []struct {
		name, path string
		engine     Engine
		want       Engine
		wantErr    error
		absent     bool // the error is also ErrNoEngineMetrics
	}{
		{name: "sglang detected", path: "/sglang", want: EngineSGLang},
		{name: "llama.cpp detected", path: "/llamacpp", want: EngineLlamaCpp},
		{name: "tgi detected", path: "/tgi", want: EngineTGI},
		{name: "tgi configured", path: "/tgi", engine: EngineTGI, want: EngineTGI},
		{name: "configured vllm, replica is sglang", path: "/sglang", engine: EngineVLLM, wantErr: ErrNoEngineMetrics, absent: true},
		{name: "404: metrics not enabled", path: "/nope", wantErr: ErrHTTPStatus, absent: true},
		{name: "501: llama-server without --metrics", path: "/no-metrics-flag", wantErr: ErrHTTPStatus, absent: true},
		{name: "500 is a failure, not an absence", path: "/broken", wantErr: ErrHTTPStatus},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc, err := NewEngineScraperFor(srv.URL+tc.path+"/metrics", tc.engine, nil)
			if err != nil {
				t.Fatal(err)
			}
			if sc.Engine() != tc.engine || sc.Detected() != EngineAuto {
				t.Fatalf("before any scrape: engine %q detected %q", sc.Engine(), sc.Detected())
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			s, err := sc.Fetch(ctx)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || s != nil {
					t.Fatalf("stats %+v err %v, want %v", s, err, tc.wantErr)
				}
				if tc.absent != errors.Is(err, ErrNoEngineMetrics) {
					t.Errorf("errors.Is(err, ErrNoEngineMetrics) = %v: %v", !tc.absent, err)
				}
				if sc.Detected() != EngineAuto {
					t.Errorf("detected %q from a failed scrape", sc.Detected())
				}
				return
			}
			if err != nil || s.Engine != tc.want || sc.Detected() != tc.want || s.Reported&FieldRunning == 0 {
				t.Fatalf("stats %+v err %v detected %q, want %s", s, err, sc.Detected(), tc.want)
			}
		})
	}
}

func TestNewEngineSource(t *testing.T) {
	t.Parallel()
	src, err := NewEngineSource("http://10.0.0.5:8000", EngineNone, nil)
	if src != nil || err != nil {
		t.Errorf("none: %v %v, want no source and no error", src, err)
	}
	if (Target{Engine: src}).Engine != nil {
		t.Error("a none source stored in a Target is not nil")
	}
	for _, e := range []Engine{EngineAuto, EngineVLLM, EngineSGLang, EngineLlamaCpp, EngineTGI} {
		src, err := NewEngineSource("http://10.0.0.5:8000", e, nil)
		if sc, ok := src.(*EngineScraper); err != nil || !ok || sc.Engine() != e || sc.URL() != "http://10.0.0.5:8000/metrics" {
			t.Errorf("%s: %v %v", e, src, err)
		}
	}
	if _, err := NewEngineScraperFor("http://10.0.0.5:8000", EngineNone, nil); err == nil {
		t.Error("a scraper for engine none")
	}
	if _, err := NewEngineSource("http://10.0.0.5:8000", "trtllm", nil); err == nil {
		t.Error("unknown engine accepted")
	}
	if _, err := NewEngineSource("10.0.0.5:8000", EngineVLLM, nil); err == nil {
		t.Error("URL without scheme accepted")
	}
}

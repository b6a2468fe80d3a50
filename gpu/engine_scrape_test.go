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

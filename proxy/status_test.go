package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
)

// getStatus fetches path with an optional bearer token.
func getStatus(t *testing.T, url, bearer string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// The page shows every replica with its live load and the latest requests
// with their timings, refreshes itself, and gives away no replica URL.
func TestStatusPage(t *testing.T) {
	up0, up1 := newFakeVLLM(t), newFakeVLLM(t)
	tr := startRouter(t, []string{up0.url, up1.url})
	at := time.Now()
	tr.reps[0].StoreEngine(&gpu.EngineStats{Running: 7, Waiting: 3, KVUsage: 0.42, At: at})
	tr.reps[0].StoreGPU(&gpu.GPUSnapshot{At: at, GPUs: []gpu.GPUStats{{UtilizationPct: 81, MemoryUsedBytes: 30 << 30,
		MemoryTotalBytes: 80 << 30, PowerWatts: 512, TemperatureC: 66, ThrottleReasons: []string{"sw_power_cap"}}}})
	tr.reps[1].SetHealthy(false)
	for range 3 {
		resp := post(t, tr.url+"/v1/chat/completions", chatPlain, "X-Request-Id", "status-probe")
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
	}

	for _, path := range []string{"/status", "/"} {
		code, hdr, body := getStatus(t, tr.url+path, "")
		if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") {
			t.Fatalf("GET %s: %d %s", path, code, hdr.Get("Content-Type"))
		}
		for _, want := range []string{
			`<meta http-equiv="refresh" content="5">`,
			`Pool m`, `round_robin`, `<span class="ok">1</span> of 2`, `Admission</dt><dd class="none">off`,
			`data-replica="r0"`, `<td class="running">7</td><td class="waiting">3</td><td class="kv">42.0%</td>`,
			`<td class="gpu-util">81.0%</td>`, `30.0/80.0 GiB`, `512.0 W`, `throttled`, `capacity`,
			`data-replica="r1"`, `<span class="bad">down</span>`, `no engine telemetry yet`,
			`status-probe`, `<span class="ok">200</span>`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("GET %s lacks %q", path, want)
			}
		}
		for _, secret := range []string{up0.url, up1.url, strings.TrimPrefix(up0.url, "http://")} {
			if strings.Contains(body, secret) {
				t.Errorf("GET %s shows the replica address %s", path, secret)
			}
		}
		if !strings.Contains(hdr.Get("Content-Security-Policy"), "default-src 'none'") || hdr.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("GET %s headers: %v", path, hdr)
		}
	}
	if served := tr.reps[0].Served(); served != 3 {
		t.Errorf("r0 served %d, want 3 (r1 is down)", served)
	}
}

// With a status token the page needs it, as a bearer token or ?token=.
func TestStatusPageToken(t *testing.T) {
	up := newFakeVLLM(t)
	tr := startRouterWith(t, []string{up.url}, func(o *Options) { o.StatusToken = "s3cret-admin" })
	for _, c := range []struct {
		name, path, bearer string
		want               int
	}{
		{"none", "/status", "", 401},
		{"wrong bearer", "/status", "nope", 401},
		{"wrong query", "/status?token=nope", "", 401},
		{"empty query", "/status?token=", "", 401},
		{"bearer", "/status", "s3cret-admin", 200},
		{"query", "/status?token=s3cret-admin", "", 200},
		{"root with query", "/?token=s3cret-admin", "", 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, hdr, body := getStatus(t, tr.url+c.path, c.bearer)
			if code != c.want {
				t.Fatalf("%d, want %d: %s", code, c.want, body)
			}
			if c.want == 401 {
				if strings.Contains(body, "s3cret") || !strings.Contains(body, "admin token") || hdr.Get("WWW-Authenticate") == "" {
					t.Errorf("refusal: %v %s", hdr, body)
				}
			}
		})
	}
	// The rest of the router is not behind the status token.
	if code, _, _ := getStatus(t, tr.url+"/metrics", ""); code != 200 {
		t.Errorf("/metrics: %d", code)
	}
}

func TestStatusPageMethods(t *testing.T) {
	tr := startRouter(t, []string{newFakeVLLM(t).url})
	resp := post(t, tr.url+"/status", "{}")
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /status: %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// Admission's queue and the A/B arms appear when the pool has them; names
// are escaped as HTML.
func TestStatusPageArmsEscaped(t *testing.T) {
	tr := startRouter(t, []string{newFakeVLLM(t).url})
	if err := tr.pool.SetArms([]balancer.Arm{{Name: "<b>a</b>", Policy: "round_robin", Share: 0.25}, {Name: "b", Policy: "least_request", Share: 0.75}}); err != nil {
		t.Fatal(err)
	}
	_, _, body := getStatus(t, tr.url+"/status", "")
	for _, want := range []string{"&lt;b&gt;a&lt;/b&gt;", "25.0%", "least_request", "75.0%"} {
		if !strings.Contains(body, want) {
			t.Errorf("lacks %q", want)
		}
	}
	if strings.Contains(body, "<b>a</b>") {
		t.Error("arm name not escaped")
	}
}

package main

// The status page in a real browser: headless Chromium loads /status from
// a router in front of a running fleet under load, dumps the DOM it
// rendered and takes a screenshot; each replica must appear with its
// numbers. GPUROUTER_STATUS_SCREENSHOT names where the screenshot goes (a
// temporary directory otherwise).

import (
	"image/png"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// chromiumArgs are the flags of a headless, offline, throwaway Chromium:
// no sandbox (tests may run as root), no GPU, no background traffic, a
// fresh profile.
func chromiumArgs(profile string) []string {
	return []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--hide-scrollbars", "--user-data-dir=" + profile}
}

// replicaRow finds a replica's row in the rendered page.
func replicaRow(dom, name string) string {
	re := regexp.MustCompile(`(?s)<tr class="replica" data-replica="` + regexp.QuoteMeta(name) + `">(.*?)</tr>`)
	if m := re.FindStringSubmatch(dom); m != nil {
		return m[1]
	}
	return ""
}

// cell is the text of the row's cell of the given class.
func cell(row, class string) (string, bool) {
	m := regexp.MustCompile(`<td class="` + class + `">([^<]*)</td>`).FindStringSubmatch(row)
	if m == nil {
		return "", false
	}
	return m[1], true
}

func TestStatusPageInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet, a router and a browser")
	}
	chromium := needBinary(t, "chromium", "chromium")
	const token = "status-page-admin-token"
	of := startObservedFleet(t, 3, nil, token)
	of.load(t, 20)
	page := of.router + "/status?" + url.Values{"token": {token}}.Encode()

	// The page is behind the admin token.
	if resp, err := http.Get(of.router + "/status"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/status without the token: %d, want 401", resp.StatusCode)
	}
	// Until every replica has served requests and reported its engine
	// and GPU, the page has less to show: wait (bounded) for that first.
	var missing string
	waitUntil(t, 20*time.Second, "every replica served, scraped and GPU-read", func() bool {
		html := fetch(t, page)
		for _, name := range of.names {
			row := replicaRow(html, name)
			served, _ := cell(row, "served")
			_, engine := cell(row, "kv")
			_, gpu := cell(row, "gpu-util")
			if n, _ := strconv.Atoi(served); n == 0 || !engine || !gpu {
				missing = name + ": " + row
				return false
			}
		}
		return true
	}, &missing)

	profile := t.TempDir()
	dom, errOut, err := runBounded(t, 60*time.Second, nil, chromium, append(chromiumArgs(profile), "--dump-dom", page)...)
	if err != nil || !strings.Contains(dom, "gpurouter status") {
		t.Fatalf("chromium --dump-dom: %v\n%s\nstderr: %s", err, tail([]byte(dom), 2000), tail([]byte(errOut), 2000))
	}
	number := regexp.MustCompile(`^[0-9]+(\.[0-9]+)?%?$`)
	for _, name := range of.names {
		row := replicaRow(dom, name)
		if row == "" {
			t.Errorf("replica %s is not on the page", name)
			continue
		}
		for _, class := range []string{"in-flight", "served", "running", "waiting", "kv", "gpu-util"} {
			if v, ok := cell(row, class); !ok || !number.MatchString(v) {
				t.Errorf("replica %s: %s is %q, want a number:\n%s", name, class, v, row)
			}
		}
		if !strings.Contains(row, `<span class="ok">up</span>`) || !strings.Contains(row, `<span class="ok">closed</span>`) {
			t.Errorf("replica %s: not shown up with its breaker closed:\n%s", name, row)
		}
		// Its address is its name here (host:port, the default), so it
		// appears; no URL does.
		if strings.Contains(row, "http://") {
			t.Errorf("replica %s: the row shows a URL:\n%s", name, row)
		}
	}
	for _, want := range []string{"Pool m", "least-loaded", "round-robin", "Admission queue", "Latest requests", `http-equiv="refresh"`} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if n := strings.Count(dom, `<span class="ok">200</span>`); n == 0 {
		t.Error("no finished request listed")
	}

	shot := os.Getenv("GPUROUTER_STATUS_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "gpurouter-status.png")
	}
	out, errOut, err := runBounded(t, 60*time.Second, nil, chromium,
		append(chromiumArgs(t.TempDir()), "--screenshot="+shot, "--window-size=1280,1600", page)...)
	if err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s%s", err, out, tail([]byte(errOut), 2000))
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.DecodeConfig(f)
	if err != nil || img.Width != 1280 || img.Height != 1600 {
		t.Fatalf("screenshot %s: %+v %v, want a 1280x1600 PNG", shot, img, err)
	}
	t.Logf("screenshot of the status page: %s", shot)
}

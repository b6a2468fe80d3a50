package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func adapterNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("lora-%d", i)
	}
	return out
}

func counts(reqs []Request) map[string]int {
	c := map[string]int{}
	for _, r := range reqs {
		c[r.Model]++
	}
	return c
}

func TestAdapterMixAssign(t *testing.T) {
	const n = 20000
	for _, c := range []struct {
		name string
		mix  AdapterMix
	}{
		{"zipf 1", AdapterMix{Names: adapterNames(32), Zipf: 1}},
		{"uniform", AdapterMix{Names: adapterNames(4)}},
		{"weights", AdapterMix{Names: []string{"a", "b", "c"}, Weights: []float64{6, 0, 2}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.mix.Validate(); err != nil {
				t.Fatal(err)
			}
			reqs := make([]Request, n)
			c.mix.Assign(reqs, 42)
			got := counts(reqs)
			for i, share := range c.mix.Shares() {
				name := c.mix.Names[i]
				if share == 0 && got[name] != 0 {
					t.Errorf("%s, of weight 0, drawn %d times", name, got[name])
				}
				// Binomial: 5 standard deviations, plus one request.
				sd := math.Sqrt(n * share * (1 - share))
				if d := math.Abs(float64(got[name]) - n*share); d > 5*sd+1 {
					t.Errorf("%s: %d requests, want %.0f ± %.0f", name, got[name], n*share, 5*sd)
				}
			}
			again := make([]Request, n)
			c.mix.Assign(again, 42)
			if !reflect.DeepEqual(again, reqs) {
				t.Error("same seed, different assignment")
			}
		})
	}
	zipf := AdapterMix{Names: adapterNames(32), Zipf: 1}.Shares()
	if r := zipf[0] / zipf[1]; math.Abs(r-2) > 1e-12 || math.Abs(zipf[0]-1/4.0585) > 1e-3 {
		t.Errorf("Zipf(1) over 32: first share %v, first/second %v", zipf[0], r)
	}
	rr := make([]Request, 5)
	AdapterMix{Names: []string{"x", "y"}, Zipf: 3, RoundRobin: true}.Assign(rr, 1)
	if got := []string{rr[0].Model, rr[1].Model, rr[2].Model, rr[3].Model, rr[4].Model}; !reflect.DeepEqual(got, []string{"x", "y", "x", "y", "x"}) {
		t.Errorf("round robin: %v", got)
	}
	none := []Request{{Prompt: "p"}}
	AdapterMix{}.Assign(none, 1)
	if none[0].Model != "" {
		t.Error("the zero mix named a model")
	}
}

func TestAdapterMixValidateAndWeightsFile(t *testing.T) {
	for _, bad := range []AdapterMix{
		{Names: []string{"a", ""}},
		{Names: []string{"a"}, Weights: []float64{1, 2}},
		{Names: []string{"a"}, Weights: []float64{0}},
		{Names: []string{"a"}, Weights: []float64{math.NaN()}},
		{Names: []string{"a"}, Zipf: -1},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrAdapters) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	names, ws, err := ParseAdapterWeights(strings.NewReader("# adapter weight\nsql 4\n\nchat,1.5\n  code\t0.5  \n"))
	if err != nil || !reflect.DeepEqual(names, []string{"sql", "chat", "code"}) || !reflect.DeepEqual(ws, []float64{4, 1.5, 0.5}) {
		t.Errorf("ParseAdapterWeights = %v %v %v", names, ws, err)
	}
	for _, bad := range []string{"", "# nothing\n", "sql\n", "sql 1 2\n", "sql x\n", "sql -1\n", "sql 1\nsql 2\n"} {
		if _, _, err := ParseAdapterWeights(strings.NewReader(bad)); !errors.Is(err, ErrAdapters) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// Per-adapter latency: the top adapters by requests, then the others;
// console, JSON and Markdown show it; without adapters nothing changes.
func TestSummaryByAdapter(t *testing.T) {
	rec := func(model string, ttft, e2e time.Duration, ok bool) Record {
		r := Record{Model: model, TTFT: ttft, E2E: e2e, Chunks: 1, OutputTokens: 1}
		if !ok {
			r.Reason, r.Chunks = ReasonHTTP(503), 0
		}
		return r
	}
	var recs []Record
	for i := range 6 {
		recs = append(recs, rec("big", time.Duration(10+i)*time.Millisecond, 100*time.Millisecond, true))
	}
	for i := range 4 {
		recs = append(recs, rec("mid", 200*time.Millisecond, 900*time.Millisecond, i > 0))
	}
	recs = append(recs, rec("tail-b", 50*time.Millisecond, time.Second, true), rec("tail-a", 70*time.Millisecond, 2*time.Second, true),
		rec("tail-a", 90*time.Millisecond, 3*time.Second, true))
	res := &Result{Records: recs, Duration: time.Second, Model: "base"}
	s := Summarize(res, MetricOptions{TopAdapters: 2})
	want := []AdapterSummary{
		{Name: "big", Adapters: 1, Requests: 6, Completed: 6, TTFTP50: 12.5, TTFTP99: 14.95, E2ELP50: 100, E2ELP99: 100},
		{Name: "mid", Adapters: 1, Requests: 4, Completed: 3, Failed: 1, TTFTP50: 200, TTFTP99: 200, E2ELP50: 900, E2ELP99: 900},
		{Name: OthersAdapter, Adapters: 2, Requests: 3, Completed: 3, TTFTP50: 70, TTFTP99: 89.6, E2ELP50: 2000, E2ELP99: 2980},
	}
	if len(s.Adapters) != len(want) {
		t.Fatalf("adapters %+v", s.Adapters)
	}
	for i, w := range want {
		g := s.Adapters[i]
		if g.Name != w.Name || g.Adapters != w.Adapters || g.Requests != w.Requests || g.Completed != w.Completed ||
			g.Failed != w.Failed || math.Abs(g.TTFTP50-w.TTFTP50) > 1e-9 || math.Abs(g.TTFTP99-w.TTFTP99) > 1e-9 ||
			math.Abs(g.E2ELP50-w.E2ELP50) > 1e-9 || math.Abs(g.E2ELP99-w.E2ELP99) > 1e-9 {
			t.Errorf("entry %d: %+v, want %+v", i, g, w)
		}
	}

	var con bytes.Buffer
	if err := WriteConsole(&con, res, s); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(con.String(), "Latency by Adapter (ms)") || !strings.Contains(con.String(), "others (2)") {
		t.Errorf("console:\n%s", con.String())
	}
	js := ResultJSON(res, s, JSONMeta{})
	al, _ := js["gpurouter_adapter_latency"].([]map[string]any)
	models, _ := js["gpurouter_models"].([]string)
	if len(al) != 3 || al[2]["name"] != OthersAdapter || len(models) != len(recs) || models[0] != "big" {
		t.Errorf("json: %v %v", al, models)
	}
	if _, err := json.Marshal(js); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := WriteReport(dir, ReportInput{Result: res, Summary: s, LoRASwaps: &LoRASwaps{CPU: 3, Disk: 2, Requests: 13}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	if !strings.Contains(md, "## Latency by adapter") || !strings.Contains(md, "3 from the CPU cache, 2 from disk — 384.6 per 1,000 requests") {
		t.Errorf("report:\n%s", md)
	}

	plain := Summarize(&Result{Records: []Record{rec("", time.Millisecond, time.Millisecond, true)}, Duration: time.Second}, MetricOptions{})
	con.Reset()
	_ = WriteConsole(&con, res, plain)
	if plain.Adapters != nil || strings.Contains(con.String(), "Adapter") {
		t.Errorf("no adapters, yet %+v", plain.Adapters)
	}
	if _, ok := ResultJSON(res, plain, JSONMeta{})["gpurouter_adapter_latency"]; ok {
		t.Error("adapter keys without adapters")
	}
}

// The request body names the request's own model when it has one.
func TestRunSendsEachRequestsModel(t *testing.T) {
	up := startUpstream(t, func(string) sseScript { return sseScript{tokens: 2} })
	reqs := fixedRequests(3, 4)
	reqs[1].Model = "sql-lora"
	res, err := Run(context.Background(), Config{BaseURL: up.url, Model: "base", Requests: reqs, RequestIDPrefix: "m-"})
	if err != nil {
		t.Fatal(err)
	}
	for i, rec := range res.Records {
		var body struct {
			Model string `json:"model"`
		}
		l := up.log(rec.ID)
		if l == nil || json.Unmarshal([]byte(l.body), &body) != nil {
			t.Fatalf("request %d not seen", i)
		}
		want := map[int]string{1: "sql-lora"}[i]
		if body.Model != map[bool]string{true: want, false: "base"}[want != ""] || rec.Model != want {
			t.Errorf("request %d: body model %q, record %q", i, body.Model, rec.Model)
		}
	}
}

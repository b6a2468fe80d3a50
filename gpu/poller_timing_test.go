package gpu

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/valyala/fasthttp"
)

// BenchmarkScrapeParse parses one realistic vLLM /metrics body (~490 lines,
// 47 KB: every V1 family, histograms, process and HTTP metrics). "prefilter"
// is what the scraper does; "expfmt-all" parses every family, the baseline
// the prefilter is measured against.
func BenchmarkScrapeParse(b *testing.B) {
	body := readTestdata(b, "vllm_v1.txt")
	b.Run("prefilter", func(b *testing.B) {
		p := newEngineParser(EngineAuto)
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := p.parse(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("expfmt-all", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			tp := expfmt.NewTextParser(model.UTF8Validation)
			if _, err := tp.TextToMetricFamilies(bytes.NewReader(body)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// memDoer is an in-memory HTTP transport: every request gets the same
// 200 response, with no sockets, so the benchmark measures the poller, the
// fasthttp request/response handling and the parser.
type memDoer struct{ body []byte }

func (m memDoer) DoDeadline(_ *fasthttp.Request, resp *fasthttp.Response, _ time.Time) error {
	resp.SetStatusCode(fasthttp.StatusOK)
	resp.SetBodyRaw(m.body)
	return nil
}

// roundSink counts stores into a WaitGroup, one Done per snapshot.
type roundSink struct{ wg *sync.WaitGroup }

func (s roundSink) StoreEngine(*EngineStats) { s.wg.Done() }
func (s roundSink) StoreGPU(*GPUSnapshot)    { s.wg.Done() }

// BenchmarkPoller1000 is the budget: the poller handles 1,000
// replicas at 250 ms within one core, i.e. one round of 1,000 scrapes costs
// under 250 ms of CPU. Each iteration is one round, driven by a fake clock
// (every replica's ticker ticks once, then all 1,000 snapshots are awaited).
// cpu-ms/round is the process's user+system CPU per round.
//
//	inmem:    in-memory transport; the poller, fasthttp client types and parser
//	loopback: one fasthttp server on 127.0.0.1 serving 1,000 paths, one
//	          HostClient (TCP connection) per replica; the server's CPU is in
//	          the number too, so it is an upper bound
func BenchmarkPoller1000(b *testing.B) {
	const replicas = 1000
	body := readTestdata(b, "vllm_v1.txt")
	b.Run("inmem", func(b *testing.B) {
		benchPoller(b, replicas, func(i int) (EngineSource, error) {
			return NewEngineScraper(fmt.Sprintf("http://replica-%d:8000", i), memDoer{body})
		})
	})
	b.Run("loopback", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBody(body) }, Concurrency: 4 * replicas}
		go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
		defer srv.Shutdown()
		addr := ln.Addr().String()
		benchPoller(b, replicas, func(i int) (EngineSource, error) {
			return NewEngineScraper(fmt.Sprintf("http://%s/r/%d/metrics", addr, i), nil)
		})
	})
}

func benchPoller(b *testing.B, n int, newSource func(i int) (EngineSource, error)) {
	clk := newFakeClock()
	var wg sync.WaitGroup
	targets := make([]Target, n)
	for i := range targets {
		src, err := newSource(i)
		if err != nil {
			b.Fatal(err)
		}
		targets[i] = Target{Name: fmt.Sprintf("r%d", i), Engine: src, Sink: roundSink{&wg}}
	}
	p, err := NewPoller(PollerConfig{Clock: clk, Interval: 250 * time.Millisecond, Timeout: 5 * time.Second}, targets)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	wg.Add(n) // the first round, at start
	go func() { done <- p.Run(ctx) }()
	tickers := make([]*fakeTicker, n)
	for i := range tickers {
		tickers[i] = <-clk.tickers
	}
	wg.Wait()

	b.ReportAllocs()
	rounds := 0
	cpu0, wall0 := cpuTime(b), time.Now()
	for b.Loop() {
		wg.Add(n)
		for _, tk := range tickers {
			tk.tick(clk.Now())
		}
		wg.Wait()
		rounds++
	}
	cpu, wall := cpuTime(b)-cpu0, time.Since(wall0)
	cancel()
	<-done
	for _, h := range p.Health() {
		if h.Engine.Failures != 0 {
			b.Fatalf("%s: %d failed scrapes", h.Name, h.Engine.Failures)
		}
	}
	perRound := cpu / time.Duration(rounds)
	b.ReportMetric(float64(perRound)/1e6, "cpu-ms/round")
	b.ReportMetric(float64(wall/time.Duration(rounds))/1e6, "wall-ms/round")
	b.ReportMetric(0, "ns/op") // a round's wall time is the two metrics above
	if budget := 250 * time.Millisecond; perRound > budget && !raceEnabled {
		b.Errorf("one round of %d scrapes took %v of CPU, budget %v (one core at a 250 ms interval)", n, perRound, budget)
	}
}

package sim

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	capacityDuration = flag.Duration("sim.capacity.duration", 10*time.Second, "measurement window of BenchmarkCapacity")
	capacityStreams  = flag.Int("sim.capacity.streams", 256, "concurrent streams per replica in BenchmarkCapacity")
	capacitySpin     = flag.Duration("sim.capacity.spin", 0, "FleetConfig.SpinWait in BenchmarkCapacity (0 = default)")
	capacitySpeed    = flag.Float64("sim.capacity.speed", 1, "replica speed in BenchmarkCapacity (scales the token rate)")
)

// BenchmarkCapacity measures the instrument itself: one process runs 4
// replicas with 256 concurrent streams each (the load generator in the same
// process, on the same cores), and reports how late the real-time loops end
// their steps (actual − intended). Run it alone:
//
//	go test ./bench/sim -run '^$' -bench Capacity -benchtime 1x
//
// It runs the scenario once whatever b.N is; the numbers are in the
// reported metrics (lag-p50-ms, lag-p99-ms, lag-max-ms, tok/s, …).
func BenchmarkCapacity(b *testing.B) {
	for _, name := range []string{"tinyllama-1.1b-a10", "qwen2.5-7b", "qwen3.5-9b-h100"} {
		b.Run(name, func(b *testing.B) { benchCapacity(b, name, 4, *capacityStreams) })
	}
}

func benchCapacity(b *testing.B, profile string, replicas, streams int) {
	b.ReportAllocs()
	p := mustBuiltin(b, profile)
	p.Engine.MaxNumSeqs = max(p.Engine.MaxNumSeqs, streams)
	f := startFleet(b, FleetConfig{Replicas: replicas, Profiles: []Profile{p}, ServedModelNames: []string{"m"},
		SpinWait: *capacitySpin, Speeds: []float64{*capacitySpeed}})
	d, _ := p.derive()
	outLen := min(2000, d.maxModelLen-64) // streams outlive the measurement
	body := fmt.Sprintf(`{"model":"m","stream":true,"prompt":"tell me a long story","max_tokens":%d,"ignore_eos":true}`, outLen)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var events, failures atomic.Int64
	for _, u := range f.URLs() {
		addr := strings.TrimPrefix(u, "http://")
		for range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					err := streamOnce(ctx, addr, body, &events)
					if err != nil && ctx.Err() == nil {
						failures.Add(1)
					}
				}
			}()
		}
	}
	defer func() {
		cancel()
		wg.Wait()
	}()

	waitFor(b, 60*time.Second, "all streams running", func() bool {
		for _, r := range f.Replicas() {
			if r.State().Running < streams {
				return false
			}
		}
		return true
	})
	for _, r := range f.Replicas() {
		r.ResetStepLag()
	}
	ev0 := events.Load()
	cpu0 := processCPU()
	b.ResetTimer()
	start := time.Now()
	time.Sleep(*capacityDuration)
	elapsed := time.Since(start)
	b.StopTimer()
	cpu := processCPU() - cpu0
	ev := events.Load() - ev0

	var all []time.Duration
	steps := 0
	for _, r := range f.Replicas() {
		r.mu.Lock()
		n := min(r.lag.n, lagRingSize)
		all = append(all, r.lag.buf[:n]...)
		steps += r.lag.n
		r.mu.Unlock()
	}
	s := summarize(all)
	var mx time.Duration
	for _, x := range all {
		mx = max(mx, x)
	}
	b.ReportMetric(float64(s.Median)/1e6, "lag-p50-ms")
	b.ReportMetric(float64(s.P99)/1e6, "lag-p99-ms")
	b.ReportMetric(float64(mx)/1e6, "lag-max-ms")
	b.ReportMetric(float64(steps)/elapsed.Seconds(), "steps/s")
	b.ReportMetric(float64(ev)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(replicas*streams), "streams")
	b.ReportMetric(float64(failures.Load()), "failures")
	b.ReportMetric(cpu.Seconds()/elapsed.Seconds(), "cpu-cores")
}

// streamOnce runs one streaming request over a fresh connection and counts
// the SSE events received into events.
func streamOnce(ctx context.Context, addr, body string, events *atomic.Int64) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	req := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		addr, len(body), body)
	if _, err := io.WriteString(c, req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 4<<10), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	buf := make([]byte, 4<<10)
	var tail []byte
	for {
		k, err := resp.Body.Read(buf)
		events.Add(int64(bytes.Count(buf[:k], []byte("data: "))))
		if k > 0 {
			tail = append(tail[:0], buf[max(0, k-16):k]...)
		}
		if err == io.EOF {
			if !bytes.Contains(tail, []byte("[DONE]")) {
				return io.ErrUnexpectedEOF
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}

package sim

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkEngineStep is one schedule+complete cycle with 256 sequences
// decoding: the engine's own cost per simulated step.
func BenchmarkEngineStep(b *testing.B) {
	b.ReportAllocs()
	p := mustBuiltin(b, "qwen3.5-9b-h100")
	e, err := newEngine(p, newEngineMetrics(prometheus.NewRegistry(), metricsOptions{modelName: "m", maxModelLen: 32768}))
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(0, 0)
	for i := range 256 {
		e.add(&seq{id: uint64(i), prompt: 500, target: 1 << 30, maxTokens: 30000, salt: uint64(i), sink: nopSink{}}, now)
	}
	for e.waiting.len() > 0 || e.running[0].output == 0 { // admit and prefill everyone
		now = now.Add(e.schedule(now))
		e.complete(now)
	}
	b.ResetTimer()
	for b.Loop() {
		now = now.Add(e.schedule(now))
		e.complete(now)
	}
}

type nopSink struct{}

func (nopSink) emit(int, finishReason, time.Time) {}

// BenchmarkSimulate measures virtual-time speed: simulated output tokens
// per second of CPU are reported as tokens/op÷ns/op.
func BenchmarkSimulate(b *testing.B) {
	b.ReportAllocs()
	p := mustBuiltin(b, "tinyllama-1.1b-a10")
	w := Workload{NumPrompts: 500, MaxConcurrency: 200, IgnoreEOS: true,
		Classes: []RequestClass{{InputLen: 500, OutputLen: 200}}}
	for b.Loop() {
		if _, err := Simulate(p, w); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(500*200), "tokens/op")
}

// BenchmarkStreamChunk renders one SSE chunk; it must not allocate once the
// buffer has grown.
func BenchmarkStreamChunk(b *testing.B) {
	b.ReportAllocs()
	r := &Replica{words: fillerWords()}
	q := &request{r: r, chat: true, idJSON: []byte(`"chatcmpl-1"`), model: []byte(`"m"`), created: 1,
		s: &seq{salt: 7}}
	buf := make([]byte, 0, 512)
	for b.Loop() {
		buf = q.appendChunk(buf[:0], 1, reasonNone)
	}
}

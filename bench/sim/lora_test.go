package sim

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// LoRA in the engine model, in virtual time: the scheduler's max_loras
// rule, the LRU caches, the swap costs and vllm:lora_requests_info.

// loraProfile is qwen2.5-7b serving LoRA with a fixed KV cache, so that
// turning LoRA on or off changes nothing but LoRA.
func loraProfile(t *testing.T, maxLoRAs, maxCPU int) Profile {
	p := mustBuiltin(t, "qwen2.5-7b")
	p.Engine.NumGPUBlocksOverride = 4096
	p.Engine.EnableLoRA, p.Engine.MaxLoRAs, p.Engine.MaxCPULoRAs = true, maxLoRAs, maxCPU
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return p
}

type loraRig struct {
	e   *engine
	reg *prometheus.Registry
	as  map[string]*loraAdapter
	now time.Time
}

// newLoRARig builds an engine of p with adapters of these names, none
// preloaded.
func newLoRARig(t *testing.T, p Profile, names ...string) *loraRig {
	t.Helper()
	d, _ := p.derive()
	reg := prometheus.NewRegistry()
	e, err := newEngine(p, newEngineMetrics(reg, metricsOptions{modelName: "m", maxModelLen: d.maxModelLen, maxLoRAs: d.lora.maxLoRAs}))
	if err != nil {
		t.Fatal(err)
	}
	r := &loraRig{e: e, reg: reg, as: map[string]*loraAdapter{}, now: time.Unix(1_700_000_000, 0)}
	for i, n := range names {
		r.as[n] = &loraAdapter{id: i + 1, name: n, path: "/a/" + n}
	}
	return r
}

// add queues a request for adapter name ("" = the base model).
func (r *loraRig) add(name string, prompt, out int) *countSink {
	s := &countSink{}
	r.e.add(&seq{id: uint64(len(r.as)*1000 + r.e.waiting.len()), prompt: prompt, target: out, maxTokens: out,
		salt: uint64(r.now.UnixNano()) + uint64(r.e.waiting.len()), lora: r.as[name], sink: s, arrival: r.now}, r.now)
	return s
}

// step runs one step and returns its duration and the adapters in it.
func (r *loraRig) step(t *testing.T) (time.Duration, []string) {
	t.Helper()
	d := r.e.schedule(r.now)
	var in []string
	for _, b := range r.e.batch {
		if b.s.lora != nil && !slices.Contains(in, b.s.lora.name) {
			in = append(in, b.s.lora.name)
		}
	}
	r.now = r.now.Add(d)
	r.e.complete(r.now)
	return d, in
}

func TestLoRABatchHoldsAtMostMaxLoRAs(t *testing.T) {
	r := newLoRARig(t, loraProfile(t, 2, 8), "a", "b", "c", "d")
	// FCFS order a b c a d b: with two slots the first step takes a, b and
	// the second a; c and d wait for a step without a or b, keeping their
	// places.
	sinks := []*countSink{r.add("a", 64, 20), r.add("b", 64, 20), r.add("c", 64, 20), r.add("a", 64, 20),
		r.add("d", 64, 20), r.add("b", 64, 3), r.add("", 64, 20)}
	_, first := r.step(t)
	if !reflect.DeepEqual(first, []string{"a", "b"}) {
		t.Fatalf("first step's adapters %v, want [a b]", first)
	}
	if len(r.e.running) != 5 || r.e.waiting.len() != 2 || r.e.waiting.at(0).lora.name != "c" || r.e.waiting.at(1).lora.name != "d" {
		t.Fatalf("running %d, waiting %d (%v %v): want a, b, a, b and the base running, c then d waiting",
			len(r.e.running), r.e.waiting.len(), r.e.waiting.at(0).lora, r.e.waiting.at(1).lora)
	}
	for steps := 0; !r.e.idle(); steps++ {
		if steps > 10000 {
			t.Fatal("engine does not drain")
		}
		_, in := r.step(t)
		if len(in) > 2 {
			t.Fatalf("a step ran adapters %v: more than max_loras 2", in)
		}
	}
	for i, s := range sinks {
		if s.reason != reasonLength {
			t.Errorf("request %d ended %v", i, s.reason)
		}
	}
}

func TestLoRASwapCostsAndLRU(t *testing.T) {
	p := loraProfile(t, 2, 3)
	d := deriveLoRA(p)
	if d.adapterBytes != 16*3584*28*2*2*4 || d.cpuSwap < time.Millisecond || d.diskLoad < 50*time.Millisecond {
		t.Fatalf("derived %+v", d)
	}
	r := newLoRARig(t, p, "a", "b", "c", "d")
	base := newLoRARig(t, p)
	// One decode-sized request at a time: each step's cost is the same
	// roofline, plus the LoRA share, plus the swaps.
	cost := func(name string) (time.Duration, time.Duration) {
		r.add(name, 16, 1)
		got, _ := r.step(t)
		base.add("", 16, 1)
		want, _ := base.step(t)
		return got, want
	}
	for _, c := range []struct {
		name     string
		swap     time.Duration
		gpu, cpu []string
	}{
		{"a", d.diskLoad + d.cpuSwap, []string{"a"}, []string{"a"}},
		{"a", 0, []string{"a"}, []string{"a"}},
		{"b", d.diskLoad + d.cpuSwap, []string{"a", "b"}, []string{"a", "b"}},
		{"c", d.diskLoad + d.cpuSwap, []string{"b", "c"}, []string{"a", "b", "c"}}, // slot of a (LRU) taken
		{"a", d.cpuSwap, []string{"c", "a"}, []string{"b", "c", "a"}},              // from the CPU cache
		{"d", d.diskLoad + d.cpuSwap, []string{"a", "d"}, []string{"c", "a", "d"}}, // b leaves the cache
		{"b", d.diskLoad + d.cpuSwap, []string{"d", "b"}, []string{"a", "d", "b"}}, // c leaves cache and slot
	} {
		got, roof := cost(c.name)
		want := roof + time.Duration(float64(roof)*d.perAdapter) + c.swap
		if got != want {
			t.Errorf("%s: step %v, want %v (roofline %v + 0.9%% + swap %v)", c.name, got, want, roof, c.swap)
		}
		if g, cc := names(r.e.lora.gpu), names(r.e.lora.cpu); !reflect.DeepEqual(g, c.gpu) || !reflect.DeepEqual(cc, c.cpu) {
			t.Errorf("%s: GPU %v CPU %v, want %v %v", c.name, g, cc, c.gpu, c.cpu)
		}
	}
	le := r.e.lora
	if le.swaps[swapFromDisk] != 5 || le.swaps[swapFromCPU] != 1 {
		t.Errorf("swaps %v, want 1 from the CPU cache and 5 from disk", le.swaps)
	}
	if v := counterOf(t, r.reg, "gpurouter_sim_lora_swaps_total", "source", "disk"); v != 5 {
		t.Errorf("gpurouter_sim_lora_swaps_total{source=disk} = %v", v)
	}
	if v := counterOf(t, r.reg, "gpurouter_sim_lora_swaps_total", "source", "cpu"); v != 1 {
		t.Errorf("gpurouter_sim_lora_swaps_total{source=cpu} = %v", v)
	}
}

// More adapters in a batch, a longer step: the punica kernels' share.
func TestLoRAStepGrowsWithAdapters(t *testing.T) {
	p := loraProfile(t, 8, 8)
	var prev time.Duration
	for _, n := range []int{0, 1, 2, 4, 8} {
		var ns []string
		for i := range n {
			ns = append(ns, string(rune('a'+i)))
		}
		r := newLoRARig(t, p, ns...)
		for i := range 8 {
			name := ""
			if n > 0 {
				name = ns[i%n]
				r.e.lora.preload(r.as[name])
			}
			r.add(name, 16, 2)
		}
		r.step(t) // prefill
		d, _ := r.step(t)
		if d <= prev {
			t.Errorf("%d adapters: decode step %v, not above %v", n, d, prev)
		}
		prev = d
	}
}

// LoRA on with no adapter requested changes nothing.
func TestLoRAOnWithoutAdaptersIsUnchanged(t *testing.T) {
	w := Workload{NumPrompts: 60, RequestRate: 8, Seed: 5, Classes: []RequestClass{{InputLen: 400, OutputLen: 100, RangeRatio: 0.5}}}
	off := loraProfile(t, 4, 4)
	off.Engine.EnableLoRA = false
	if a, b := simulate(t, off, w), simulate(t, loraProfile(t, 4, 4), w); !reflect.DeepEqual(a, b) {
		t.Errorf("LoRA on without adapters:\n%+v\nLoRA off:\n%+v", b, a)
	}
}

// Fewer GPU slots than popular adapters: requests for other adapters wait
// until a slot's requests are done (vLLM batches by adapter rather than
// swap every step), so latency, not the swap count, is what suffers. With
// max_cpu_loras = max_loras every swap is a load from disk; a CPU cache
// that holds every adapter turns them all into copies.
func TestLoRASlotsAndCacheUnderZipf(t *testing.T) {
	w := Workload{NumPrompts: 400, RequestRate: 20, Seed: 7, Adapters: 32, AdapterZipf: 1,
		Classes: []RequestClass{{InputLen: 256, OutputLen: 64, RangeRatio: 0.5}}}
	few := simulate(t, loraProfile(t, 2, 8), w)
	many := simulate(t, loraProfile(t, 8, 8), w)
	all := simulate(t, loraProfile(t, 2, 32), w)
	if few.TTFT.Median <= 2*many.TTFT.Median || few.Duration <= many.Duration {
		t.Errorf("2 slots: median TTFT %v over %v; 8 slots: %v over %v", few.TTFT.Median, few.Duration,
			many.TTFT.Median, many.Duration)
	}
	if many.LoRASwapsCPU != 0 || many.LoRASwapsDisk == 0 {
		t.Errorf("max_cpu_loras = max_loras: %d swaps from the CPU cache, %d from disk", many.LoRASwapsCPU, many.LoRASwapsDisk)
	}
	if all.LoRASwapsDisk != 0 || all.LoRASwapsCPU == 0 || all.LoRASwapTime >= few.LoRASwapTime/10 {
		t.Errorf("every adapter cached: %d disk loads, %d copies in %v (8 cached: %v)", all.LoRASwapsDisk,
			all.LoRASwapsCPU, all.LoRASwapTime, few.LoRASwapTime)
	}
	if again := simulate(t, loraProfile(t, 2, 8), w); !reflect.DeepEqual(again, few) {
		t.Error("same seed, different reports")
	}
}

func TestLoRARequestsInfo(t *testing.T) {
	r := newLoRARig(t, loraProfile(t, 1, 4), "x", "y")
	r.add("x", 32, 2)
	r.add("y", 32, 2)
	r.add("x", 32, 2)
	latest := func() (running, waiting string, n int) {
		series := gaugeSeries(t, r.reg, "vllm:lora_requests_info")
		best := -1.0
		for _, s := range series {
			if s.labels["max_lora"] != "1" {
				t.Fatalf("labels %v", s.labels)
			}
			if s.value > best {
				best, running, waiting = s.value, s.labels["running_lora_adapters"], s.labels["waiting_lora_adapters"]
			}
		}
		return running, waiting, len(series)
	}
	if run, wait, _ := latest(); run != "" || wait != "x,y" {
		t.Errorf("before the first step: running %q waiting %q", run, wait)
	}
	r.step(t)
	if run, wait, _ := latest(); run != "x" || wait != "y" {
		t.Errorf("after a step: running %q waiting %q, want x and y", run, wait)
	}
	for steps := 0; !r.e.idle(); steps++ {
		if steps > 100 {
			t.Fatal("engine does not drain")
		}
		r.step(t)
	}
	if run, wait, n := latest(); run != "" || wait != "" || n < 3 {
		t.Errorf("drained: running %q waiting %q over %d series", run, wait, n)
	}
	// A long run keeps the family bounded.
	for i := range 3 * loraInfoSeries {
		r.e.lora.m.relabel(strings.Repeat("x", i+1), "")
	}
	if n := len(gaugeSeries(t, r.reg, "vllm:lora_requests_info")); n != loraInfoSeries {
		t.Errorf("%d series, want %d", n, loraInfoSeries)
	}
}

func TestLoRAValidation(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*Profile)
		want string
	}{
		{"cpu below gpu", func(p *Profile) { p.Engine.MaxLoRAs, p.Engine.MaxCPULoRAs = 4, 2 }, "max_cpu_loras (2) must be >= max_loras (4)"},
		{"rank", func(p *Profile) { p.Engine.MaxLoRARank = 12 }, "max_lora_rank (12)"},
		{"no model shape", func(p *Profile) { p.Model.HiddenSize = 0 }, "hidden_size"},
		{"negative", func(p *Profile) { p.Engine.MaxLoRAs = -1 }, ">= 0"},
		{"negative cost", func(p *Profile) { p.LoRA.DiskGBps = -1 }, "costs"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := mustBuiltin(t, "qwen2.5-7b")
			p.Engine.EnableLoRA = true
			c.set(&p)
			if err := p.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Validate = %v, want %q", err, c.want)
			}
		})
	}
	p := mustBuiltin(t, "qwen2.5-7b")
	blocks := p.NumGPUBlocks()
	for _, kv := range [][2]string{{"enable-lora", "true"}, {"max-loras", "4"}, {"max-cpu-loras", "32"}, {"max-lora-rank", "64"}} {
		if err := p.Set(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := p.NumGPUBlocks(); got >= blocks {
		t.Errorf("4 rank-64 slots leave %d KV blocks, not fewer than %d", got, blocks)
	}
}

type series struct {
	labels map[string]string
	value  float64
}

func gaugeSeries(t *testing.T, g prometheus.Gatherer, name string) []series {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []series
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			out = append(out, series{labels: labelMap(m), value: m.GetGauge().GetValue() + m.GetCounter().GetValue()})
		}
	}
	return out
}

func labelMap(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

func counterOf(t *testing.T, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	for _, s := range gaugeSeries(t, g, name) {
		if s.labels[label] == value {
			return s.value
		}
	}
	return -1
}

package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

func TestDecompose(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name      string
		in        DecompositionInput
		wantComps []float64 // network+router, router queue, engine queue, prefill, decode (NaN: not measured)
		residual  float64
		parts     map[string]float64
	}{
		{
			// C 2.000, R 1.990, Qr 0.010, E 1.975, Qe 0.100, P 0.050, D 1.800.
			name:      "router and engine",
			in:        DecompositionInput{Requests: 10, ClientE2E: 2.0, RouterE2E: 1.99, RouterQueue: 0.01, EngineE2E: 1.975, EngineQueue: 0.1, Prefill: 0.05, Decode: 1.8},
			wantComps: []float64{0.01, 0.01, 0.1, 0.05, 1.8},
			residual:  0.03, // 2 − (0.01 + 0.01 + 0.1 + 0.05 + 1.8)
			parts:     map[string]float64{PartRouterEngine: 0.005, PartEngineFrontend: 0.025},
		},
		{
			name:      "bare engine",
			in:        DecompositionInput{Requests: 3, ClientE2E: 1.0, RouterE2E: nan, RouterQueue: nan, EngineE2E: 0.99, EngineQueue: 0, Prefill: 0.2, Decode: 0.78},
			wantComps: []float64{nan, nan, 0, 0.2, 0.78},
			residual:  0.02,
			parts:     map[string]float64{PartClientEngine: 0.01, PartEngineFrontend: 0.01},
		},
		{
			// No prefill histogram: its time stays in the residual, and
			// the engine frontend part cannot be computed.
			name:      "unmeasured phase stays in the residual",
			in:        DecompositionInput{Requests: 1, ClientE2E: 1.0, RouterE2E: 0.999, RouterQueue: 0, EngineE2E: 0.99, EngineQueue: 0.01, Prefill: nan, Decode: 0.7},
			wantComps: []float64{0.001, 0, 0.01, nan, 0.7},
			residual:  0.289,
			parts:     map[string]float64{PartRouterEngine: 0.009},
		},
		{
			// Components can overshoot (means over different requests): the
			// residual goes negative rather than being clamped.
			name:      "negative residual shown",
			in:        DecompositionInput{Requests: 1, ClientE2E: 1.0, RouterE2E: 0.99, RouterQueue: 0, EngineE2E: 1.05, EngineQueue: 0, Prefill: 0.1, Decode: 0.95},
			wantComps: []float64{0.01, 0, 0, 0.1, 0.95},
			residual:  -0.06,
			parts:     map[string]float64{PartRouterEngine: -0.06, PartEngineFrontend: 0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decompose(tt.in)
			names := []string{CompNetworkRouter, CompRouterQueue, CompEngineQueue, CompPrefill, CompDecode}
			if len(d.Components) != len(names) {
				t.Fatalf("components %+v", d.Components)
			}
			for i, c := range d.Components {
				if c.Name != names[i] || !sameMeasure(c.Seconds, tt.wantComps[i]) {
					t.Errorf("component %d = %s %v, want %s %v", i, c.Name, c.Seconds, names[i], tt.wantComps[i])
				}
			}
			if !approx(d.Residual, tt.residual) {
				t.Errorf("residual %v, want %v", d.Residual, tt.residual)
			}
			if len(d.ResidualParts) != len(tt.parts) {
				t.Fatalf("parts %+v, want %v", d.ResidualParts, tt.parts)
			}
			sum := 0.0
			for _, p := range d.ResidualParts {
				if want, ok := tt.parts[p.Name]; !ok || !approx(p.Seconds, want) {
					t.Errorf("part %s = %v, want %v", p.Name, p.Seconds, tt.parts[p.Name])
				}
				sum += p.Seconds
			}
			if len(tt.parts) == 2 && !approx(sum, d.Residual) {
				t.Errorf("parts sum %v ≠ residual %v with every input measured", sum, d.Residual)
			}
			if !approx(d.ResidualShare(), math.Abs(tt.residual)/tt.in.ClientE2E) {
				t.Errorf("share %v", d.ResidualShare())
			}
		})
	}
}

func sameMeasure(a, b float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	return approx(a, b)
}

func approx(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestNewDecompositionInput(t *testing.T) {
	hist := func(count, sum float64) Histogram {
		return Histogram{Bounds: []float64{1, math.Inf(1)}, Cumulative: []float64{count, count}, Count: count, Sum: sum}
	}
	res := &Result{Records: []Record{
		{ID: "a", Chunks: 2, E2E: 1000 * time.Millisecond},
		{ID: "b", Chunks: 2, E2E: 3000 * time.Millisecond},
		{ID: "c", Reason: ReasonTimeout},
	}}
	phases := EnginePhases{E2E: hist(2, 3.9), Queue: hist(2, 0.2), Prefill: hist(2, 0.1), Decode: hist(2, 3.4)}

	t.Run("with router: means over matched requests", func(t *testing.T) {
		m := &RouterMatch{Pairs: []MatchedRequest{{Client: &res.Records[1], Router: RouterRecord{E2ES: 2.99, QueueS: 0.02}}}}
		in := NewDecompositionInput(res, m, phases)
		if in.Requests != 1 || !approx(in.ClientE2E, 3) || !approx(in.RouterE2E, 2.99) || !approx(in.RouterQueue, 0.02) {
			t.Errorf("input %+v", in)
		}
		if !approx(in.EngineE2E, 1.95) || !approx(in.EngineQueue, 0.1) || !approx(in.Prefill, 0.05) || !approx(in.Decode, 1.7) {
			t.Errorf("engine means %+v", in)
		}
	})
	t.Run("bare engine: completed client requests", func(t *testing.T) {
		in := NewDecompositionInput(res, nil, EnginePhases{Decode: hist(2, 3.4)})
		if in.Requests != 2 || !approx(in.ClientE2E, 2) || !math.IsNaN(in.RouterE2E) || !math.IsNaN(in.Prefill) {
			t.Errorf("input %+v", in)
		}
	})
}

func TestWriteDecomposition(t *testing.T) {
	d := Decompose(DecompositionInput{Requests: 10, ClientE2E: 2.0, RouterE2E: 1.99, RouterQueue: 0.01,
		EngineE2E: 1.975, EngineQueue: 0.1, Prefill: math.NaN(), Decode: 1.8})
	var buf bytes.Buffer
	if err := WriteDecomposition(&buf, d); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"Requests (client, matched to router):",
		"Client mean E2E (ms):", "2000.00  100.0%",
		"Network + router overhead (ms):", "10.00    0.5%",
		"Prefill (ms):", "Residual (ms):", "80.00    4.0%",
		"of which router -> engine (R - Qr - E) (ms):", "5.00",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	prefill := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "Prefill (ms):") {
			prefill = l
		}
	}
	if !strings.HasSuffix(prefill, " -") {
		t.Errorf("unmeasured prefill not shown as -:\n%s", out)
	}
	if strings.Contains(out, "engine frontend") {
		t.Errorf("engine frontend part printed without a prefill:\n%s", out)
	}
}

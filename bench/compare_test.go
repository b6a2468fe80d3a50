package bench

import (
	"bytes"
	"strings"
	"testing"
)

func TestColumnFromSnapshotsAndComparison(t *testing.T) {
	itlBounds := []float64{0.01, 0.025, 0.05, 0.075, 0.1}
	page := func(ttft, itl []float64, oldITLName bool) Snapshot {
		itlName := "vllm:inter_token_latency_seconds"
		if oldITLName {
			itlName = "vllm:time_per_output_token_seconds"
		}
		text := exposition("vllm:time_to_first_token_seconds", map[string][]float64{`engine="0",model_name="m"`: ttft}, ttftBuckets) +
			exposition(itlName, map[string][]float64{`engine="0",model_name="m"`: itl}, itlBounds)
		s, err := ParseMetrics(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Two engines; the second is an older vLLM with the old ITL name.
	before := []Snapshot{page([]float64{0.05}, []float64{0.02}, false), page(nil, nil, true)}
	after := []Snapshot{
		page([]float64{0.05, 0.09, 0.2}, []float64{0.02, 0.02, 0.03}, false),
		page([]float64{0.15}, []float64{0.04, 0.06}, true),
	}
	col, err := ColumnFromSnapshots("engine", before, after, VLLMHistogramNames(), map[string]string{"model_name": "m"})
	if err == nil || !strings.Contains(err.Error(), "tpot") {
		t.Errorf("err = %v, want the missing TPOT histogram reported", err)
	}
	if h := col.Rows[RowTTFT]; h.Count != 3 || !near(h.Sum, 0.44) {
		t.Fatalf("TTFT delta count %v sum %v, want 3 and 0.44", h.Count, h.Sum)
	}
	if h := col.Rows[RowITL]; h.Count != 4 {
		t.Fatalf("ITL delta count %v, want 4 (2 new + old name's 2)", h.Count)
	}
	if _, ok := col.Rows[RowTPOT]; ok {
		t.Fatal("TPOT row present without a histogram")
	}
	var buf bytes.Buffer
	s := Summarize(timeline(), MetricOptions{})
	if err := WriteComparison(&buf, s, []float64{50, 99}, col); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	// TTFT observations 0.09 0.2 0.15: p50 at rank 1.5 in (100, 250] ms.
	for _, want := range []string{"Client vs Server Latency", "TTFT   mean", "116.67", "146.67", "[100–250]", "QUEUE  P99", "TPOT   P50"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

package sim

import (
	"testing"
	"time"
)

// A colocated fleet of N sustains about N times one replica at
// saturation; a split fleet completes every request through a prefill, a
// read and a decode, deterministically.
func TestSimulateFleet(t *testing.T) {
	p := mustBuiltin(t, "qwen3.5-9b-h100")
	w := Workload{NumPrompts: 400, IgnoreEOS: true, Seed: 3, Classes: []RequestClass{{InputLen: 6000, OutputLen: 200, RangeRatio: 0.5}}}
	one, err := SimulateFleet(p, w, FleetShape{})
	if err != nil {
		t.Fatal(err)
	}
	four, err := SimulateFleet(p, w, FleetShape{Replicas: 4})
	if err != nil {
		t.Fatal(err)
	}
	if four.Completed != 400 || four.RequestThroughput < 3.2*one.RequestThroughput || four.RequestThroughput > 4.4*one.RequestThroughput {
		t.Errorf("4 replicas: %d done, %.2f req/s; one replica %.2f req/s", four.Completed, four.RequestThroughput, one.RequestThroughput)
	}

	w.NumPrompts, w.RequestRate = 120, 2
	split, err := SimulateFleet(p, w, FleetShape{Prefill: 1, Decode: 3})
	if err != nil {
		t.Fatal(err)
	}
	if split.Completed != 120 || split.KVTransfers != 120 {
		t.Fatalf("split: %d done, %d reads", split.Completed, split.KVTransfers)
	}
	// ≈6,000 tokens × 32 KiB at 50 GB/s: ≈4 ms a read.
	if m := split.KVTransferTime.Mean; m < time.Millisecond || m > 10*time.Millisecond {
		t.Errorf("mean read %v", m)
	}
	if split.TTFT.Median <= split.KVTransferTime.Median {
		t.Errorf("TTFT %v not above the read %v", split.TTFT.Median, split.KVTransferTime.Median)
	}
	again, _ := SimulateFleet(p, w, FleetShape{Prefill: 1, Decode: 3})
	if again.TTFT != split.TTFT || again.TPOT != split.TPOT {
		t.Error("not deterministic")
	}
	if _, err := SimulateFleet(p, w, FleetShape{Prefill: 1}); err == nil {
		t.Error("a split without decode replicas was accepted")
	}
}

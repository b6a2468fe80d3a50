package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/gpurouter/gpurouter/bench"
)

// loraFlags are `gpurouter bench`'s adapter workload flags: vllm bench's
// --lora-modules and --lora-assignment, and how popular each adapter is
// (--lora-zipf, or --lora-weights FILE).
type loraFlags struct {
	modules    benchList
	zipf       *float64
	weights    *string
	assignment *string
}

func registerLoRAFlags(fs *flag.FlagSet) *loraFlags {
	l := &loraFlags{}
	fs.Var(&l.modules, "lora-modules", "LoRA adapters to send requests to, as each request's model (names, several after one flag, comma- or space-separated, or repeated); mixed into any dataset")
	l.zipf = fs.Float64("lora-zipf", 0, "adapter popularity: the k-th of --lora-modules gets weight 1/k^S (0 = uniform, as vllm bench's random assignment; 1 = Zipf)")
	l.weights = fs.String("lora-weights", "", "file of adapter popularity, one 'NAME WEIGHT' a line (instead of --lora-modules and --lora-zipf)")
	l.assignment = fs.String("lora-assignment", "random", "random (drawn by popularity) or round-robin (the adapters in turn), as vllm bench's")
	return l
}

// mix resolves the flags to an adapter mix (the zero mix without them),
// reading the weights file; set says which flags were given.
func (l *loraFlags) mix(set map[string]bool) (bench.AdapterMix, []string) {
	var errs []string
	var m bench.AdapterMix
	for _, v := range l.modules {
		m.Names = append(m.Names, strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' })...)
	}
	m.Zipf = *l.zipf
	switch *l.assignment {
	case "random":
	case "round-robin":
		m.RoundRobin = true
		if set["lora-zipf"] || *l.weights != "" {
			errs = append(errs, "--lora-assignment round-robin sends to every adapter in turn: no --lora-zipf or --lora-weights")
		}
	default:
		errs = append(errs, fmt.Sprintf("--lora-assignment %q: want random or round-robin", *l.assignment))
	}
	if *l.weights != "" {
		if len(m.Names) > 0 || set["lora-zipf"] {
			errs = append(errs, "--lora-weights names the adapters and their weights: no --lora-modules or --lora-zipf with it")
		}
		f, err := os.Open(*l.weights)
		if err != nil {
			return m, append(errs, "--lora-weights: "+err.Error())
		}
		defer f.Close()
		if m.Names, m.Weights, err = bench.ParseAdapterWeights(f); err != nil {
			return m, append(errs, "--lora-weights "+*l.weights+": "+strings.TrimPrefix(err.Error(), "bench: "))
		}
	}
	if len(m.Names) == 0 && (set["lora-zipf"] || set["lora-assignment"]) {
		errs = append(errs, "--lora-zipf and --lora-assignment need --lora-modules or --lora-weights")
	}
	if err := m.Validate(); err != nil {
		for _, e := range strings.Split(err.Error(), "\n") {
			errs = append(errs, strings.TrimPrefix(e, "bench: "))
		}
	}
	return m, errs
}

// expandLoRANames joins vllm bench's multi-value form "--lora-modules a b
// c" into one argument, which the flag package would otherwise stop at.
func expandLoRANames(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		out = append(out, args[i])
		if args[i] != "--lora-modules" && args[i] != "-lora-modules" {
			continue
		}
		var vals []string
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++
			vals = append(vals, args[i])
		}
		if len(vals) > 0 {
			out = append(out, strings.Join(vals, " "))
		}
	}
	return out
}

// describeMix says on w how the requests are spread, and returns the
// result file's keys about it.
func describeMix(w io.Writer, m bench.AdapterMix) map[string]any {
	shares := m.Shares()
	how := "drawn by weight"
	switch {
	case m.RoundRobin:
		how = "in turn"
	case m.Weights == nil && m.Zipf == 0:
		how = "uniformly"
	case m.Weights == nil:
		how = fmt.Sprintf("by Zipf(%v)", m.Zipf)
	}
	fmt.Fprintf(w, "bench: requests go to %d LoRA adapters %s: %s %.1f%% of them", len(m.Names), how, m.Names[0], 100*shares[0])
	if len(m.Names) > 1 {
		fmt.Fprintf(w, ", %s %.1f%%", m.Names[len(m.Names)-1], 100*shares[len(shares)-1])
	}
	fmt.Fprintln(w)
	return map[string]any{"gpurouter_lora_adapters": m.Names, "gpurouter_lora_shares": shares,
		"gpurouter_lora_zipf": m.Zipf, "gpurouter_lora_assignment": map[bool]string{true: "round-robin", false: "random"}[m.RoundRobin]}
}

// printLoRASwaps prints the engines' swaps over the run and adds them to
// the result file's keys.
func printLoRASwaps(w io.Writer, sw *bench.LoRASwaps, extra map[string]any) {
	fmt.Fprintf(w, "LoRA swaps on the engines: %.0f from the CPU cache, %.0f from disk, %.1f per 1,000 requests\n",
		sw.CPU, sw.Disk, sw.PerKiloRequests())
	var per any = sw.PerKiloRequests()
	if math.IsNaN(sw.PerKiloRequests()) {
		per = nil // JSON has no NaN
	}
	extra["gpurouter_lora_swaps"] = map[string]any{"cpu": sw.CPU, "disk": sw.Disk, "requests": sw.Requests, "per_1000_requests": per}
}

// loraSwapFloor is the fewest swaps any placement could have made on the
// run (bench.SwapFloor), over the GPU slots the engines report; false when
// no request named an adapter or no engine reported its slots.
func loraSwapFloor(recs []bench.Record, usage []bench.EngineUsage, m bench.AdapterMix) (bench.SwapFloor, bool) {
	slots := 0
	for _, u := range usage {
		slots += u.MaxLoRAs
	}
	if slots == 0 || len(m.Names) == 0 {
		return bench.SwapFloor{}, false
	}
	var shares []float64
	if !m.RoundRobin {
		shares = m.Shares()
	}
	f := bench.LoRASwapFloor(recs, slots, shares)
	return f, f.Requests > 0
}

// printLoRASwapFloor prints the swap floor beside the measured swaps and
// adds it to the result file's keys.
func printLoRASwapFloor(w io.Writer, f bench.SwapFloor, extra map[string]any) {
	fmt.Fprintf(w, "LoRA swaps no placement goes below, over the fleet's %d GPU slots: %.1f per 1,000 requests knowing every request ahead (Belady)",
		f.Slots, f.PerKilo(float64(f.Offline)))
	floor := map[string]any{"slots": f.Slots, "requests": f.Requests, "offline": f.Offline, "offline_per_1000_requests": f.PerKilo(float64(f.Offline))}
	if !math.IsNaN(f.Online) {
		fmt.Fprintf(w, ", %.1f expected placing each request as it comes", f.PerKilo(f.Online))
		floor["online"], floor["online_per_1000_requests"] = f.Online, f.PerKilo(f.Online)
	}
	fmt.Fprintln(w)
	extra["gpurouter_lora_swap_floor"] = floor
}

package bench

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// ErrAdapters is wrapped by every error about an adapter mix.
var ErrAdapters = errors.New("bench: adapters")

// AdapterMix spreads a benchmark's requests over LoRA adapters: each
// request names one as its model (vLLM serves an adapter under its name),
// whatever dataset the requests come from. The zero value names none, and
// every request goes to Config.Model.
type AdapterMix struct {
	// Names are the adapters, most popular first.
	Names []string
	// Weights, when set, are the adapters' relative popularity, one per
	// name (a weights file); otherwise popularity follows Zipf's law over
	// the names' rank: the k-th (from 1) weighs 1/k^Zipf, so 0 is uniform
	// (vllm bench's --lora-modules) and 1 is the classic Zipf.
	Weights []float64
	Zipf    float64
	// RoundRobin assigns the names in turn instead of drawing them
	// (vllm bench's --lora-assignment round-robin); weights are ignored.
	RoundRobin bool
}

// Validate reports every problem with m, joined.
func (m AdapterMix) Validate() error {
	var errs []error
	for _, n := range m.Names {
		if strings.TrimSpace(n) == "" {
			errs = append(errs, fmt.Errorf("%w: an empty adapter name", ErrAdapters))
			break
		}
	}
	if m.Weights != nil {
		sum := 0.0
		for _, w := range m.Weights {
			if !(w >= 0) || math.IsInf(w, 0) {
				errs = append(errs, fmt.Errorf("%w: weight %v: want a finite number >= 0", ErrAdapters, w))
				break
			}
			sum += w
		}
		if len(m.Weights) != len(m.Names) {
			errs = append(errs, fmt.Errorf("%w: %d weights for %d adapters", ErrAdapters, len(m.Weights), len(m.Names)))
		} else if sum <= 0 && len(m.Names) > 0 {
			errs = append(errs, fmt.Errorf("%w: the weights add up to 0", ErrAdapters))
		}
	}
	if !(m.Zipf >= 0) || math.IsInf(m.Zipf, 0) {
		errs = append(errs, fmt.Errorf("%w: Zipf exponent %v: want a finite number >= 0", ErrAdapters, m.Zipf))
	}
	return errors.Join(errs...)
}

// weights are the adapters' relative popularity.
func (m AdapterMix) weights() []float64 {
	if m.Weights != nil {
		return m.Weights
	}
	w := make([]float64, len(m.Names))
	for k := range w {
		w[k] = math.Pow(float64(k+1), -m.Zipf)
	}
	return w
}

// Shares are the adapters' expected shares of the requests, in Names
// order.
func (m AdapterMix) Shares() []float64 {
	w := m.weights()
	if m.RoundRobin {
		w = make([]float64, len(m.Names))
		for i := range w {
			w[i] = 1
		}
	}
	sum := 0.0
	for _, x := range w {
		sum += x
	}
	out := make([]float64, len(w))
	for i, x := range w {
		out[i] = x / sum
	}
	return out
}

// Assign sets the Model of every request to an adapter of m, drawn with a
// generator of its own seeded by seed (so the dataset's requests stay what
// they are with or without adapters). A mix without names leaves reqs
// alone.
func (m AdapterMix) Assign(reqs []Request, seed uint64) {
	if len(m.Names) == 0 {
		return
	}
	if m.RoundRobin {
		for i := range reqs {
			reqs[i].Model = m.Names[i%len(m.Names)]
		}
		return
	}
	cum := m.weights()
	cum = slices.Clone(cum)
	for i := 1; i < len(cum); i++ {
		cum[i] += cum[i-1]
	}
	total := cum[len(cum)-1]
	rng := rand.New(rand.NewPCG(seed, seed^0x10AA_D0E5))
	for i := range reqs {
		k, _ := slices.BinarySearch(cum, rng.Float64()*total)
		for k < len(cum)-1 && cum[k] == 0 { // a zero weight is never drawn
			k++
		}
		reqs[i].Model = m.Names[min(k, len(m.Names)-1)]
	}
}

// ParseAdapterWeights reads a weights file: one adapter a line, its name
// and its weight separated by blanks or a comma ("sql-lora 0.4"); blank
// lines and lines starting with # are skipped. Names keep the file's order.
func ParseAdapterWeights(r io.Reader) (names []string, weights []float64, err error) {
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		f := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
		if len(f) != 2 {
			return nil, nil, fmt.Errorf("%w: weights line %d %q: want NAME WEIGHT", ErrAdapters, line, s)
		}
		w, perr := strconv.ParseFloat(f[1], 64)
		if perr != nil || !(w >= 0) || math.IsInf(w, 0) {
			return nil, nil, fmt.Errorf("%w: weights line %d: %q is not a weight >= 0", ErrAdapters, line, f[1])
		}
		if slices.Contains(names, f[0]) {
			return nil, nil, fmt.Errorf("%w: weights line %d: adapter %q given twice", ErrAdapters, line, f[0])
		}
		names, weights = append(names, f[0]), append(weights, w)
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrAdapters, err)
	}
	if len(names) == 0 {
		return nil, nil, fmt.Errorf("%w: the weights file names no adapter", ErrAdapters)
	}
	return names, weights, nil
}

// OthersAdapter names the bucket of the adapters past the top ones in
// Summary.Adapters.
const OthersAdapter = "others"

// AdapterSummary is the latency of one adapter's requests (or of the
// others bucket), in ms over completed requests.
type AdapterSummary struct {
	// Name is the adapter, or OthersAdapter; Adapters is how many
	// adapters the entry covers (1 except for the bucket).
	Name     string
	Adapters int
	// Requests were sent; Completed and Failed as in Summary.
	Requests, Completed, Failed int
	TTFTP50, TTFTP99            float64
	E2ELP50, E2ELP99            float64
}

// summarizeAdapters groups records by their Model: the top adapters by
// requests sent (ties by name), then the rest in one OthersAdapter entry.
// Nil when no record names a model of its own.
func summarizeAdapters(recs []Record, top int) []AdapterSummary {
	type acc struct {
		requests, completed, failed int
		ttft, e2el                  []float64
	}
	by := map[string]*acc{}
	for i := range recs {
		r := &recs[i]
		if r.Model == "" {
			continue
		}
		a := by[r.Model]
		if a == nil {
			a = &acc{}
			by[r.Model] = a
		}
		a.requests++
		if !r.OK() {
			a.failed++
			continue
		}
		a.completed++
		a.ttft, a.e2el = append(a.ttft, ms(r.TTFT)), append(a.e2el, ms(r.E2E))
	}
	if len(by) == 0 {
		return nil
	}
	names := make([]string, 0, len(by))
	for n := range by {
		names = append(names, n)
	}
	slices.SortFunc(names, func(x, y string) int {
		if c := cmp.Compare(by[y].requests, by[x].requests); c != 0 {
			return c
		}
		return cmp.Compare(x, y)
	})
	entry := func(name string, n int, a *acc) AdapterSummary {
		t, e := newDist(a.ttft, []float64{50, 99}), newDist(a.e2el, []float64{50, 99})
		return AdapterSummary{Name: name, Adapters: n, Requests: a.requests, Completed: a.completed, Failed: a.failed,
			TTFTP50: t.Percentiles[0].Value, TTFTP99: t.Percentiles[1].Value, E2ELP50: e.Percentiles[0].Value, E2ELP99: e.Percentiles[1].Value}
	}
	var out []AdapterSummary
	others := &acc{}
	for i, n := range names {
		a := by[n]
		if i < top {
			out = append(out, entry(n, 1, a))
			continue
		}
		others.requests += a.requests
		others.completed += a.completed
		others.failed += a.failed
		others.ttft, others.e2el = append(others.ttft, a.ttft...), append(others.e2el, a.e2el...)
	}
	if len(names) > top {
		out = append(out, entry(OthersAdapter, len(names)-top, others))
	}
	return out
}

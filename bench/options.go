package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Metric names accepted by --percentile-metrics and --goodput.
const (
	MetricTTFT = "ttft"
	MetricTPOT = "tpot"
	MetricITL  = "itl"
	MetricE2EL = "e2el"
)

// AllMetrics lists the latency metrics in report order.
func AllMetrics() []string { return []string{MetricTTFT, MetricTPOT, MetricITL, MetricE2EL} }

// ErrOption is wrapped by every error parsing a metric option.
var ErrOption = errors.New("bench: option")

// SLO is a goodput objective: a request is good when every set bound holds
// (metric ≤ bound). Zero fields are unset; the zero SLO sets none, and then
// there is no goodput.
type SLO struct {
	TTFT, TPOT, E2EL time.Duration
}

// IsSet reports whether any bound is set.
func (s SLO) IsSet() bool { return s.TTFT > 0 || s.TPOT > 0 || s.E2EL > 0 }

// ParseGoodput parses vllm's --goodput arguments: KEY:VALUE pairs in ms with
// keys ttft, tpot and e2el, given as separate arguments or space-separated
// in one.
func ParseGoodput(args []string) (SLO, error) {
	var s SLO
	for _, arg := range args {
		for _, kv := range strings.Fields(arg) {
			k, v, ok := strings.Cut(kv, ":")
			if !ok {
				return SLO{}, fmt.Errorf("%w: goodput %q: want KEY:VALUE (ms), e.g. ttft:500", ErrOption, kv)
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f > 0) || math.IsInf(f, 0) {
				return SLO{}, fmt.Errorf("%w: goodput %q: value must be a positive number of ms", ErrOption, kv)
			}
			d := time.Duration(f * float64(time.Millisecond))
			switch strings.ToLower(k) {
			case MetricTTFT:
				s.TTFT = d
			case MetricTPOT:
				s.TPOT = d
			case MetricE2EL:
				s.E2EL = d
			default:
				return SLO{}, fmt.Errorf("%w: goodput %q: key must be ttft, tpot or e2el", ErrOption, kv)
			}
		}
	}
	return s, nil
}

// ParsePercentileMetrics parses --percentile-metrics ("ttft,tpot,itl").
func ParsePercentileMetrics(s string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(s, ",") {
		m = strings.ToLower(strings.TrimSpace(m))
		if m == "" {
			continue
		}
		if !slices.Contains(AllMetrics(), m) {
			return nil, fmt.Errorf("%w: percentile metric %q: want ttft, tpot, itl or e2el", ErrOption, m)
		}
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no percentile metrics", ErrOption)
	}
	return out, nil
}

// ParseMetricPercentiles parses --metric-percentiles ("50,90,99").
func ParseMetricPercentiles(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := strconv.ParseFloat(f, 64)
		if err != nil || !(p >= 0 && p <= 100) {
			return nil, fmt.Errorf("%w: percentile %q: want a number in [0, 100]", ErrOption, f)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no percentiles", ErrOption)
	}
	return out, nil
}

// percentileLabel writes p the way vllm does: "99", "99.9".
func percentileLabel(p float64) string {
	return strconv.FormatFloat(p, 'f', -1, 64)
}

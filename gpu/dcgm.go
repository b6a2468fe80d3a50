package gpu

import (
	"context"
	"slices"
	"strconv"
	"sync"

	dto "github.com/prometheus/client_model/go"
)

// DCGM exporter field names the DCGM source reads (dcgm-exporter's
// default-counters.csv). FB values are MiB, power W, temperature °C,
// clock MHz, utilisation percent.
const (
	dcgmUtil      = "DCGM_FI_DEV_GPU_UTIL"
	dcgmFBUsed    = "DCGM_FI_DEV_FB_USED"
	dcgmFBFree    = "DCGM_FI_DEV_FB_FREE"
	dcgmFBReserve = "DCGM_FI_DEV_FB_RESERVED"
	dcgmPower     = "DCGM_FI_DEV_POWER_USAGE"
	dcgmTemp      = "DCGM_FI_DEV_GPU_TEMP"
	dcgmSMClock   = "DCGM_FI_DEV_SM_CLOCK"
	mib           = 1 << 20
)

func isDCGMFamily(name []byte) bool {
	switch string(name) {
	case dcgmUtil, dcgmFBUsed, dcgmFBFree, dcgmFBReserve, dcgmPower, dcgmTemp, dcgmSMClock:
		return true
	}
	return false
}

// ParseDCGM reads a DCGM exporter's /metrics body into one GPUStats per GPU,
// in index order, keyed by the exporter's `gpu` (index) and `UUID` labels;
// the name comes from `modelName`. Memory total is used + free + reserved.
// Where a GPU has several series of one field (MIG instances, per-pod
// labels), the first wins: the DEV_ fields are per device anyway. It returns
// ErrGPUNotFound when the body has no DCGM GPU series, ErrMalformed when a
// line it reads is broken.
func ParseDCGM(text []byte) ([]GPUStats, error) {
	return (&familyParser{keep: isDCGMFamily}).parseDCGM(text)
}

func (p *familyParser) parseDCGM(text []byte) ([]GPUStats, error) {
	mfs, err := p.parse(text)
	if err != nil {
		return nil, err
	}
	var gpus []*dcgmGPU
	for _, field := range []string{dcgmUtil, dcgmFBUsed, dcgmFBFree, dcgmFBReserve, dcgmPower, dcgmTemp, dcgmSMClock} {
		mf := mfs[field]
		if mf == nil {
			continue
		}
		for _, m := range mf.Metric {
			v, ok := sampleValue(m)
			if !ok || v < 0 {
				continue
			}
			g := findDCGMGPU(&gpus, m)
			if g == nil || !g.take(field) {
				continue
			}
			switch field {
			case dcgmUtil:
				g.st.UtilizationPct = min(100, v)
			case dcgmFBUsed:
				g.used = v
			case dcgmFBFree:
				g.free = v
			case dcgmFBReserve:
				g.reserved = v
			case dcgmPower:
				g.st.PowerWatts = v
			case dcgmTemp:
				g.st.TemperatureC = v
			case dcgmSMClock:
				g.st.SMClockMHz = uint32(v)
			}
		}
	}
	if len(gpus) == 0 {
		return nil, ErrGPUNotFound
	}
	out := make([]GPUStats, 0, len(gpus))
	for _, g := range gpus {
		g.st.MemoryUsedBytes = uint64(g.used * mib)
		g.st.MemoryTotalBytes = uint64((g.used + g.free + g.reserved) * mib)
		out = append(out, g.st)
	}
	slices.SortStableFunc(out, func(a, b GPUStats) int { return a.Index - b.Index })
	return out, nil
}

// dcgmGPU accumulates one GPU's fields while parsing.
type dcgmGPU struct {
	st                   GPUStats
	used, free, reserved float64  // MiB
	taken                []string // fields already set: the first series wins
}

func (g *dcgmGPU) take(field string) bool {
	if slices.Contains(g.taken, field) {
		return false
	}
	g.taken = append(g.taken, field)
	return true
}

// findDCGMGPU returns the GPU that series m belongs to, adding it to gpus if
// new; nil when m has neither a UUID nor a numeric gpu label.
func findDCGMGPU(gpus *[]*dcgmGPU, m *dto.Metric) *dcgmGPU {
	uuid := label(m, "UUID")
	idx, err := strconv.Atoi(label(m, "gpu"))
	if uuid == "" && err != nil {
		return nil
	}
	if err != nil {
		idx = -1
	}
	for _, g := range *gpus {
		if (uuid != "" && g.st.UUID == uuid) || (uuid == "" && g.st.Index == idx) {
			return g
		}
	}
	g := &dcgmGPU{st: GPUStats{Index: idx, UUID: uuid, Name: label(m, "modelName")}}
	*gpus = append(*gpus, g)
	return g
}

// DCGMSource is the Source of GPUs read from a DCGM exporter (default
// http://HOST:9400/metrics). Build with NewDCGMSource; the zero value is
// unusable. Safe for concurrent use.
type DCGMSource struct {
	url    string
	client HTTPDoer
	sel    Selector

	mu     sync.Mutex // guards parser, whose buffer is reused across scrapes
	parser *familyParser
}

// NewDCGMSource reads the GPUs sel selects (matched against the exporter's
// `UUID` and `gpu` labels) from the exporter at exporterURL: its base URL
// (/metrics is appended) or the full metrics URL. client nil means a
// fasthttp.HostClient of its own for that host.
func NewDCGMSource(exporterURL string, sel Selector, client HTTPDoer) (*DCGMSource, error) {
	u, err := scrapeURL(exporterURL, "/metrics")
	if err != nil {
		return nil, err
	}
	if client == nil {
		client = newHostClient(u)
	}
	return &DCGMSource{url: u.String(), client: client, sel: sel, parser: &familyParser{keep: isDCGMFamily}}, nil
}

// Fetch scrapes the exporter before ctx's deadline and returns the selected GPUs.
func (s *DCGMSource) Fetch(ctx context.Context) ([]GPUStats, error) {
	var all []GPUStats
	err := get(ctx, s.client, s.url, acceptText, func(body []byte) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		var err error
		all, err = s.parser.parseDCGM(body)
		return err
	})
	if err != nil {
		return nil, err
	}
	return s.sel.pick(all)
}

package gpu

import (
	"bytes"
	"fmt"
	"math"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// familyParser parses the few metric families a source needs out of a
// Prometheus text exposition. expfmt's parser builds a protobuf message for
// every sample of every family, and a vLLM /metrics body is ~500 lines of
// which a router needs ~10, so sample lines are first filtered by metric name
// (a byte scan) and only the survivors are parsed. Dropping the # HELP and
// # TYPE lines makes every survivor untyped, which is all we need: we read
// plain sample values. A familyParser is not safe for concurrent use; its
// buffer is reused across calls.
type familyParser struct {
	keep func(name []byte) bool // true for the metric names to parse
	buf  []byte                 // the filtered text, reused
}

// parse returns the kept families by name. A malformed kept line is
// ErrMalformed; lines of other families are never looked at beyond their name.
func (p *familyParser) parse(text []byte) (map[string]*dto.MetricFamily, error) {
	p.buf = p.buf[:0]
	for len(text) > 0 {
		line := text
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i+1], text[i+1:]
		} else {
			text = nil
		}
		if p.keep(metricName(line)) {
			// Lenient about line ends (CRLF, none at EOF): the parser is not.
			line = bytes.TrimRight(line, "\r\n")
			p.buf = append(append(p.buf, line...), '\n')
		}
	}
	if len(p.buf) == 0 {
		return nil, nil
	}
	tp := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := tp.TextToMetricFamilies(bytes.NewReader(p.buf))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return mfs, nil
}

// metricName is the name at the start of a sample line: the bytes before the
// first '{', space or tab, after leading blanks. Comment and blank lines have
// no name (nil).
func metricName(line []byte) []byte {
	for len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
		line = line[1:]
	}
	if len(line) == 0 || line[0] == '#' {
		return nil
	}
	for i, c := range line {
		switch c {
		case '{', ' ', '\t', '\r', '\n':
			return line[:i]
		}
	}
	return line
}

// sampleValue is the value of an untyped, gauge or counter sample; ok is
// false when it is NaN or infinite, which no field of ours can use.
func sampleValue(m *dto.Metric) (v float64, ok bool) {
	switch {
	case m.Untyped != nil:
		v = m.Untyped.GetValue()
	case m.Gauge != nil:
		v = m.Gauge.GetValue()
	case m.Counter != nil:
		v = m.Counter.GetValue()
	default:
		return 0, false
	}
	return v, !math.IsNaN(v) && !math.IsInf(v, 0)
}

// label is the value of the named label of m, "" when absent.
func label(m *dto.Metric, name string) string {
	for _, lp := range m.Label {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

package bench

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// TraceRow is one request of an arrival trace.
type TraceRow struct {
	// Offset is the arrival time relative to the trace's first arrival.
	Offset time.Duration
	// ContextTokens is the prompt length; GeneratedTokens the output length.
	ContextTokens, GeneratedTokens int
	// Line is the 1-based line in the file, for messages.
	Line int
}

// traceColumn says which column a trace header name is, lower-cased: the
// Azure LLM inference traces (TIMESTAMP, ContextTokens, GeneratedTokens) and
// guidellm's replay names (timestamp, input_length, output_length). It
// returns "" for other columns.
func traceColumn(name string) string {
	switch name {
	case "timestamp", "time", "arrival_time":
		return "time"
	case "contexttokens", "input_length", "input_tokens", "prompt_tokens":
		return "input"
	case "generatedtokens", "output_length", "output_tokens", "completion_tokens":
		return "output"
	}
	return ""
}

// traceTimeLayouts are the timestamp forms seen in the Azure traces (2023:
// 7 fractional digits, no zone; 2024: "+00:00", sometimes no fraction).
func traceTimeLayouts() []string {
	return []string{
		"2006-01-02 15:04:05.999999999",
		"2006-01-02 15:04:05.999999999Z07:00",
		"2006-01-02T15:04:05.999999999",
		time.RFC3339Nano,
	}
}

// ParseTrace reads a CSV arrival trace with a header naming a timestamp, an
// input-length and an output-length column (any order, extra columns
// ignored). Timestamps are dates (Azure form) or plain numbers of seconds.
// Rows are returned in arrival order with offsets from the earliest one. A
// malformed row is an error naming its line.
func ParseTrace(r io.Reader) ([]TraceRow, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	var (
		tCol, inCol, outCol = -1, -1, -1
		ncols               int
		rows                []TraceRow
		abs                 []int64 // nanoseconds, absolute or numeric, parallel to rows
		numeric             = -1    // 1: numeric timestamps, 0: dates, -1: unknown yet
	)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if line == 1 {
			text = strings.TrimPrefix(text, "\uFEFF")
		}
		if text == "" {
			continue
		}
		fields := strings.Split(text, ",")
		if tCol < 0 {
			ncols = len(fields)
			for i, f := range fields {
				name := strings.ToLower(strings.Trim(strings.TrimSpace(f), `"`))
				switch traceColumn(name) {
				case "time":
					tCol = i
				case "input":
					inCol = i
				case "output":
					outCol = i
				}
			}
			if tCol < 0 || inCol < 0 || outCol < 0 {
				return nil, fmt.Errorf("%w: trace: line %d: header %q lacks a timestamp, input-length or output-length column (e.g. TIMESTAMP,ContextTokens,GeneratedTokens)", ErrDataset, line, text)
			}
			continue
		}
		if len(fields) != ncols {
			return nil, fmt.Errorf("%w: trace: line %d: %d fields, header has %d", ErrDataset, line, len(fields), ncols)
		}
		ts, isNum, err := parseTraceTime(strings.TrimSpace(fields[tCol]))
		if err != nil {
			return nil, fmt.Errorf("%w: trace: line %d: %v", ErrDataset, line, err)
		}
		kind := 0
		if isNum {
			kind = 1
		}
		if numeric >= 0 && numeric != kind {
			return nil, fmt.Errorf("%w: trace: line %d: mixes numeric and date timestamps", ErrDataset, line)
		}
		numeric = kind
		in, err := parseTraceInt(fields[inCol])
		if err != nil {
			return nil, fmt.Errorf("%w: trace: line %d: input length: %v", ErrDataset, line, err)
		}
		out, err := parseTraceInt(fields[outCol])
		if err != nil {
			return nil, fmt.Errorf("%w: trace: line %d: output length: %v", ErrDataset, line, err)
		}
		rows = append(rows, TraceRow{ContextTokens: in, GeneratedTokens: out, Line: line})
		abs = append(abs, ts)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: trace: after line %d: %v", ErrDataset, line, err)
	}
	if tCol < 0 {
		return nil, fmt.Errorf("%w: trace: empty file", ErrDataset)
	}
	if len(rows) == 0 {
		return rows, nil
	}
	first := slices.Min(abs)
	for i := range rows {
		rows[i].Offset = time.Duration(abs[i] - first)
	}
	slices.SortStableFunc(rows, func(a, b TraceRow) int { return cmp.Compare(a.Offset, b.Offset) })
	return rows, nil
}

// maxTraceSeconds bounds numeric timestamps so nanoseconds fit in an int64.
const maxTraceSeconds = 1e9

// parseTraceTime returns nanoseconds (since the Unix epoch for dates) and
// whether the field was a plain number of seconds.
func parseTraceTime(s string) (int64, bool, error) {
	s = strings.Trim(s, `"`)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if !(f >= 0 && f <= maxTraceSeconds) {
			return 0, true, fmt.Errorf("timestamp %q: want seconds in [0, 1e9]", s)
		}
		return int64(math.Round(f * 1e9)), true, nil
	}
	for _, layout := range traceTimeLayouts() {
		if t, err := time.Parse(layout, s); err == nil {
			if y := t.Year(); y < 1900 || y > 2200 {
				return 0, false, fmt.Errorf("timestamp %q: year out of range", s)
			}
			return t.UnixNano(), false, nil
		}
	}
	return 0, false, fmt.Errorf("timestamp %q: want YYYY-MM-DD HH:MM:SS[.fffffff][±hh:mm] or seconds", s)
}

func parseTraceInt(s string) (int, error) {
	s = strings.Trim(strings.TrimSpace(s), `"`)
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	if n < 0 {
		return 0, fmt.Errorf("%d < 0", n)
	}
	return n, nil
}

// TraceDataset replays rows: the first c.NumPrompts of them (all when 0),
// each at its offset divided by c.TimeScale, with a synthesised prompt of
// ContextTokens tokens and max_tokens = GeneratedTokens (at least 1 each).
// Replays are meant to run with ignore_eos so the engine generates exactly
// that many tokens (data/README.md).
func TraceDataset(rows []TraceRow, c DatasetConfig, rng *rand.Rand) *Dataset {
	if c.NumPrompts > 0 && c.NumPrompts < len(rows) {
		rows = rows[:c.NumPrompts]
	}
	scale := c.TimeScale
	if scale == 0 {
		scale = 1
	}
	d := &Dataset{Name: DatasetAzureTrace, Timed: true, Requests: make([]Request, len(rows))}
	for i, row := range rows {
		d.Requests[i] = Request{
			PromptTokens: max(row.ContextTokens, 1),
			OutputTokens: max(row.GeneratedTokens, 1),
			PromptSeed:   rng.Uint64(),
			Arrival:      time.Duration(float64(row.Offset) / scale),
		}
	}
	return d
}

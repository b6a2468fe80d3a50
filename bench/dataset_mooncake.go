package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/gpurouter/gpurouter/bench/tokens"
)

// MooncakeBlockTokens is the size of a Mooncake trace's prompt block: one
// hash id stands for 512 tokens.
const MooncakeBlockTokens = 512

// MooncakeRow is one request of a Mooncake trace (the FAST'25 release's
// synthetic, conversation and tool/agent traces, and the arXiv one): JSON
// Lines of {"timestamp": ms, "input_length": n, "output_length": n,
// "hash_ids": [...]}.
type MooncakeRow struct {
	// Offset is the arrival time relative to the trace's first arrival.
	Offset time.Duration
	// InputLength is the prompt length in tokens; OutputLength the output.
	InputLength, OutputLength int
	// HashIDs are the prompt's 512-token blocks: two rows that start with
	// the same ids share that prefix.
	HashIDs []uint64
	// Line is the 1-based line in the file, for messages.
	Line int
}

// maxMooncakeMs bounds timestamps (about 31 years) so nanoseconds fit.
const maxMooncakeMs = 1e12

// ParseMooncake reads a Mooncake trace. Blank lines are skipped and fields
// other than the four are ignored (a later release may add some). Rows come
// back in arrival order (stable), with offsets from the earliest one. A
// line that is not such an object, or has a negative or non-finite value,
// is an error naming the line.
func ParseMooncake(r io.Reader) ([]MooncakeRow, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxCustomLine)
	var rows []MooncakeRow
	var abs []float64 // ms, parallel to rows
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if line == 1 {
			b = bytes.TrimPrefix(b, []byte("\uFEFF"))
		}
		if len(b) == 0 {
			continue
		}
		var rec struct {
			Timestamp    *float64  `json:"timestamp"`
			InputLength  *int      `json:"input_length"`
			OutputLength *int      `json:"output_length"`
			HashIDs      *[]uint64 `json:"hash_ids"`
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		if err := dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("%w: mooncake: line %d: %v", ErrDataset, line, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("%w: mooncake: line %d: more than one JSON value", ErrDataset, line)
		}
		switch {
		case rec.Timestamp == nil || rec.InputLength == nil || rec.OutputLength == nil || rec.HashIDs == nil:
			return nil, fmt.Errorf("%w: mooncake: line %d: want timestamp, input_length, output_length and hash_ids", ErrDataset, line)
		case !(*rec.Timestamp >= 0 && *rec.Timestamp <= maxMooncakeMs):
			return nil, fmt.Errorf("%w: mooncake: line %d: timestamp %v: want milliseconds in [0, 1e12]", ErrDataset, line, *rec.Timestamp)
		case *rec.InputLength < 0 || *rec.OutputLength < 0:
			return nil, fmt.Errorf("%w: mooncake: line %d: negative length", ErrDataset, line)
		}
		rows = append(rows, MooncakeRow{InputLength: *rec.InputLength, OutputLength: *rec.OutputLength, HashIDs: *rec.HashIDs, Line: line})
		abs = append(abs, *rec.Timestamp)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: mooncake: after line %d: %v", ErrDataset, line, err)
	}
	if len(rows) == 0 {
		return rows, nil
	}
	first := slices.Min(abs)
	for i := range rows {
		rows[i].Offset = time.Duration(math.Round((abs[i] - first) * 1e6))
	}
	slices.SortStableFunc(rows, func(a, b MooncakeRow) int { return cmp.Compare(a.Offset, b.Offset) })
	return rows, nil
}

// MooncakeDataset replays rows: the first c.NumPrompts of them (all when
// 0), each at its offset divided by c.TimeScale, with max_tokens =
// OutputLength (at least 1) and a prompt of InputLength tokens (at least
// 1) made of one 512-token block of text per hash id — the same tokens for
// the same id (tokens.Estimator.AppendBlock) — the last cut to length.
// Replays are meant to run with ignore_eos, as the trace's lengths are
// what the engine must generate.
func MooncakeDataset(rows []MooncakeRow, c DatasetConfig, rng *rand.Rand) *Dataset {
	if c.NumPrompts > 0 && c.NumPrompts < len(rows) {
		rows = rows[:c.NumPrompts]
	}
	scale := c.TimeScale
	if scale == 0 {
		scale = 1
	}
	d := &Dataset{Name: DatasetMooncake, Timed: true, Requests: make([]Request, len(rows))}
	for i, row := range rows {
		d.Requests[i] = Request{
			PromptTokens: max(row.InputLength, 1),
			OutputTokens: max(row.OutputLength, 1),
			PromptBlocks: row.HashIDs,
			PromptSeed:   rng.Uint64(),
			Arrival:      time.Duration(float64(row.Offset) / scale),
		}
	}
	return d
}

// blockPrompt is the text of a request with PromptBlocks: n tokens made of
// the blocks' text, each MooncakeBlockTokens long, the last cut. Where the
// blocks cover fewer than n tokens (a trace whose ids don't cover its
// length) the rest is text of the request's own, shared with no other.
func blockPrompt(est *tokens.Estimator, blocks []uint64, n int, seed uint64) string {
	b := make([]byte, 0, n*5+16)
	for _, id := range blocks {
		if n <= 0 {
			break
		}
		k := min(n, MooncakeBlockTokens)
		b = est.AppendBlock(b, id, k)
		n -= k
	}
	s := string(b)
	if n > 0 {
		s += est.Synthesize(n, seed)
	}
	return s
}

// IdealPrefixHitRate is the prefix-cache hit rate one shared cache of
// unbounded size would reach on d: of all the requests' prompt blocks
// (their hash ids, up to the prompt's length), the share whose id an
// earlier block already had. ok is false when no request has blocks.
func (d *Dataset) IdealPrefixHitRate() (rate float64, ok bool) {
	seen := map[uint64]struct{}{}
	hits, total := 0, 0
	for _, r := range d.Requests {
		n := (r.PromptTokens + MooncakeBlockTokens - 1) / MooncakeBlockTokens
		for _, id := range r.PromptBlocks[:min(n, len(r.PromptBlocks))] {
			if _, dup := seen[id]; dup {
				hits++
			}
			seen[id] = struct{}{}
			total++
		}
	}
	if total == 0 {
		return 0, false
	}
	return float64(hits) / float64(total), true
}

package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
)

// CustomRecord is one line of a custom dataset file (JSON Lines):
// {"prompt": "...", "output_tokens": 128, "use_case": "..."}. OutputTokens
// 0 means DatasetConfig.CustomOutputLen; UseCase is optional.
type CustomRecord struct {
	Prompt       string `json:"prompt"`
	OutputTokens int    `json:"output_tokens"`
	UseCase      string `json:"use_case"`
}

// maxCustomLine bounds one JSONL line (a prompt of a few million tokens).
const maxCustomLine = 64 << 20

// ParseCustom reads a custom JSONL dataset. Blank lines are skipped; a line
// that is not a JSON object, has no prompt or has a negative output_tokens
// is an error naming the line (1-based).
func ParseCustom(r io.Reader) ([]CustomRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxCustomLine)
	var out []CustomRecord
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var rec CustomRecord
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("%w: custom: line %d: %v", ErrDataset, line, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("%w: custom: line %d: more than one JSON value", ErrDataset, line)
		}
		if rec.Prompt == "" {
			return nil, fmt.Errorf("%w: custom: line %d: empty or missing prompt", ErrDataset, line)
		}
		if rec.OutputTokens < 0 {
			return nil, fmt.Errorf("%w: custom: line %d: output_tokens %d < 0", ErrDataset, line, rec.OutputTokens)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: custom: after line %d: %v", ErrDataset, len(out), err)
	}
	return out, nil
}

// CustomDataset takes the first c.NumPrompts records in file order (the file
// is the user's workload, so it is not shuffled); when there are fewer
// records it repeats randomly chosen ones, as vllm oversamples.
func CustomDataset(recs []CustomRecord, c DatasetConfig, rng *rand.Rand) (*Dataset, error) {
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w: custom: no records", ErrDataset)
	}
	defOut := c.CustomOutputLen
	if defOut == 0 {
		defOut = 256
	}
	n := c.numPrompts()
	d := &Dataset{Name: DatasetCustom, Requests: make([]Request, 0, n)}
	for _, rec := range recs[:min(n, len(recs))] {
		out := rec.OutputTokens
		if out == 0 {
			out = defOut
		}
		d.Requests = append(d.Requests, Request{
			Prompt:       rec.Prompt,
			PromptTokens: c.Estimator.Count(rec.Prompt),
			OutputTokens: out,
			UseCase:      rec.UseCase,
		})
	}
	for kept := len(d.Requests); len(d.Requests) < n; {
		d.Requests = append(d.Requests, d.Requests[rng.IntN(kept)])
	}
	return d, nil
}

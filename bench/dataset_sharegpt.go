package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
)

// ShareGPTPair is one usable ShareGPT conversation: its first human turn and
// the assistant turn that answers it.
type ShareGPTPair struct {
	Prompt, Completion string
}

type shareGPTRecord struct {
	Conversations []struct {
		From  string `json:"from"`
		Value string `json:"value"`
	} `json:"conversations"`
}

// ParseShareGPT reads a ShareGPT file (a JSON array of
// {"conversations":[{"from","value"},…]}) one record at a time, keeping only
// the first human turn and the first assistant turn after it. Records
// without such a pair are skipped, as vllm skips conversations with fewer
// than two turns. A malformed record is an error naming its index (0-based)
// and byte offset.
func ParseShareGPT(r io.Reader) ([]ShareGPTPair, error) {
	dec := json.NewDecoder(r)
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("%w: sharegpt: want a JSON array: %v", ErrDataset, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("%w: sharegpt: want a JSON array, got %v", ErrDataset, tok)
	}
	var out []ShareGPTPair
	for i := 0; dec.More(); i++ {
		off := dec.InputOffset()
		var rec shareGPTRecord
		if err := dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("%w: sharegpt: record %d (byte %d): %v", ErrDataset, i, off, err)
		}
		if p, ok := pairOf(&rec); ok {
			out = append(out, p)
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%w: sharegpt: unterminated array (byte %d): %v", ErrDataset, dec.InputOffset(), err)
	}
	return out, nil
}

func pairOf(rec *shareGPTRecord) (ShareGPTPair, bool) {
	if len(rec.Conversations) < 2 {
		return ShareGPTPair{}, false
	}
	for i, t := range rec.Conversations {
		if t.From != "human" && t.From != "user" {
			continue
		}
		for _, a := range rec.Conversations[i+1:] {
			switch a.From {
			case "human", "user", "system":
				continue
			}
			return ShareGPTPair{Prompt: t.Value, Completion: a.Value}, true
		}
		return ShareGPTPair{}, false
	}
	return ShareGPTPair{}, false
}

// validShareGPTLens is vllm's is_valid_sequence with its defaults: prompt
// and output at least 4 tokens, prompt at most 1024, together at most 2048.
func validShareGPTLens(prompt, output int) bool {
	return prompt >= 4 && output >= 4 && prompt <= 1024 && prompt+output <= 2048
}

// ShareGPTDataset samples c.NumPrompts requests from pairs the way vllm
// bench does: shuffle with the seed, count tokens, keep pairs that pass
// vllm's length filter, and when too few pass, repeat randomly chosen ones
// (vllm's oversampling). Output length is the completion's token count, or
// c.ShareGPTOutputLen when set.
func ShareGPTDataset(pairs []ShareGPTPair, c DatasetConfig, rng *rand.Rand) (*Dataset, error) {
	n := c.numPrompts()
	order := rng.Perm(len(pairs))
	d := &Dataset{Name: DatasetShareGPT, Requests: make([]Request, 0, n)}
	for _, i := range order {
		if len(d.Requests) == n {
			break
		}
		p := pairs[i]
		in := c.Estimator.Count(p.Prompt)
		out := c.Estimator.Count(p.Completion)
		if c.ShareGPTOutputLen > 0 {
			out = c.ShareGPTOutputLen
		}
		if !validShareGPTLens(in, out) {
			continue
		}
		d.Requests = append(d.Requests, Request{Prompt: p.Prompt, PromptTokens: in, OutputTokens: out})
	}
	if len(d.Requests) == 0 {
		return nil, fmt.Errorf("%w: sharegpt: no conversation passes the length filter (prompt 4…1024, output ≥ 4, total ≤ 2048 tokens)", ErrDataset)
	}
	for kept := len(d.Requests); len(d.Requests) < n; {
		d.Requests = append(d.Requests, d.Requests[rng.IntN(kept)])
	}
	return d, nil
}

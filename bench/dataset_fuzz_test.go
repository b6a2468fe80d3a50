package bench

import (
	"bytes"
	"testing"
)

// FuzzParseTrace checks the trace parser never panics and that what it
// accepts is sane: offsets start at 0, never decrease, token counts are
// non-negative and lines are real line numbers.
func FuzzParseTrace(f *testing.F) {
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"))
	f.Add([]byte("timestamp,input_length,output_length\n0.5,1,2\n0.25,3,4\n"))
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,10,20\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		rows, err := ParseTrace(bytes.NewReader(in))
		if err != nil {
			return
		}
		lines := bytes.Count(in, []byte("\n")) + 1
		for i, r := range rows {
			if i == 0 && r.Offset != 0 {
				t.Fatalf("first offset %v", r.Offset)
			}
			if i > 0 && r.Offset < rows[i-1].Offset {
				t.Fatalf("offset %d went backwards", i)
			}
			if r.ContextTokens < 0 || r.GeneratedTokens < 0 || r.Line < 2 || r.Line > lines {
				t.Fatalf("row %+v", r)
			}
		}
	})
}

// FuzzParseCustom checks the custom JSONL parser never panics and only
// accepts records with a prompt.
func FuzzParseCustom(f *testing.F) {
	f.Add([]byte(`{"prompt":"hi","output_tokens":3}` + "\n"))
	f.Add([]byte("\n\n{\"prompt\":\"a\"}"))
	f.Fuzz(func(t *testing.T, in []byte) {
		recs, err := ParseCustom(bytes.NewReader(in))
		if err != nil {
			return
		}
		for _, r := range recs {
			if r.Prompt == "" || r.OutputTokens < 0 {
				t.Fatalf("accepted %+v", r)
			}
		}
	})
}

// FuzzParseMooncake checks the Mooncake trace parser never panics and that
// what it accepts is sane: offsets start at 0 and never decrease, lengths
// are non-negative, lines are real line numbers, and the dataset built
// from the rows has prompts and outputs of at least one token.
func FuzzParseMooncake(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, 2]}` + "\n" + `{"timestamp": 40, "input_length": 1, "output_length": 0, "hash_ids": [0]}` + "\n"))
	f.Add([]byte("\n{\"timestamp\": 7.5, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": [], \"x\": null}\n{\"timestamp\": 1}"))
	f.Fuzz(func(t *testing.T, in []byte) {
		rows, err := ParseMooncake(bytes.NewReader(in))
		if err != nil {
			return
		}
		lines := bytes.Count(in, []byte("\n")) + 1
		for i, r := range rows {
			if i == 0 && r.Offset != 0 {
				t.Fatalf("first offset %v", r.Offset)
			}
			if i > 0 && r.Offset < rows[i-1].Offset {
				t.Fatalf("offset %d went backwards", i)
			}
			if r.InputLength < 0 || r.OutputLength < 0 || r.Line < 1 || r.Line > lines {
				t.Fatalf("row %+v", r)
			}
		}
		d := MooncakeDataset(rows, DatasetConfig{}, newRand(1))
		for _, r := range d.Requests {
			if r.PromptTokens < 1 || r.OutputTokens < 1 || r.Arrival < 0 {
				t.Fatalf("request %+v", r)
			}
		}
		d.IdealPrefixHitRate()
	})
}

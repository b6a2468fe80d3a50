package prefixcache

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tiktoken-go/tokenizer"
)

// cl100kRanks is cl100k_base's token bytes by rank (= id), read back from
// tiktoken-go's embedded vocabulary one id at a time.
func cl100kRanks() ([]string, error) {
	c, err := tokenizer.Get(tokenizer.Cl100kBase)
	if err != nil {
		return nil, err
	}
	var ranks []string
	for id := uint(0); ; id++ {
		s, err := c.Decode([]uint{id})
		if err != nil {
			break // past the last ordinary token (100255)
		}
		ranks = append(ranks, s)
	}
	if len(ranks) != 100256 {
		return nil, fmt.Errorf("cl100k_base has %d ranks, want 100256", len(ranks))
	}
	return ranks, nil
}

// alphabet is byteLevelAlphabet, computed once for toByteLevel's many
// calls.
var alphabet = byteLevelAlphabet()

// toByteLevel writes bytes in GPT-2's byte-level alphabet.
func toByteLevel(s string) string {
	a := &alphabet
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteRune(a[s[i]])
	}
	return b.String()
}

// cl100kSplit is cl100k_base's pre-tokenizer regex, Llama 3's too.
const cl100kSplit = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// cl100kJSON is a tokenizer.json equivalent to cl100k_base, built the way
// Hugging Face's tiktoken converter builds one: the vocabulary is the
// ranks in the byte-level alphabet; the merges are, for every token, each
// split of it into two tokens, ordered by the token's rank (then the
// halves'). Merges alternate between the "a b" and ["a","b"] spellings so
// that both are read. added are the added tokens (content → id, all
// special); extra is merged into the top level (a post_processor).
func cl100kJSON(added map[string]uint32, extra map[string]any) ([]byte, error) {
	ranks, err := cl100kRanks()
	if err != nil {
		return nil, err
	}
	rank := make(map[string]int, len(ranks))
	vocab := make(map[string]int, len(ranks))
	for r, s := range ranks {
		rank[s] = r
		vocab[toByteLevel(s)] = r
	}
	var merges []any
	for _, tok := range ranks {
		var local [][2]string
		for i := 1; i < len(tok); i++ {
			l, r := tok[:i], tok[i:]
			if _, ok := rank[l]; !ok {
				continue
			}
			if _, ok := rank[r]; ok {
				local = append(local, [2]string{l, r})
			}
		}
		slices.SortFunc(local, func(a, b [2]string) int {
			return cmp.Or(cmp.Compare(rank[a[0]], rank[b[0]]), cmp.Compare(rank[a[1]], rank[b[1]]))
		})
		for _, m := range local {
			l, r := toByteLevel(m[0]), toByteLevel(m[1])
			if len(merges)%2 == 0 {
				merges = append(merges, l+" "+r)
			} else {
				merges = append(merges, []string{l, r})
			}
		}
	}
	var addedTokens []map[string]any
	for content, id := range added {
		addedTokens = append(addedTokens, map[string]any{"id": id, "content": content, "special": true,
			"single_word": false, "lstrip": false, "rstrip": false, "normalized": false})
	}
	file := map[string]any{
		"version":      "1.0",
		"added_tokens": addedTokens,
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": cl100kSplit}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": true,
			"vocab": vocab, "merges": merges},
	}
	for k, v := range extra {
		file[k] = v
	}
	return json.Marshal(file)
}

// chatMLTokens are the added tokens of the cl100k ChatML equivalent.
var chatMLTokens = map[string]uint32{"<|endoftext|>": 100257, "<|im_start|>": 100264, "<|im_end|>": 100265}

// cl100kHF is the loaded equivalent, built once for the package's tests
// (the build takes a second or two).
var cl100kHF = sync.OnceValues(func() (*HF, error) {
	data, err := cl100kJSON(chatMLTokens, nil)
	if err != nil {
		return nil, err
	}
	return ParseHF(data)
})

func loadCL100KHF(tb testing.TB) *HF {
	tb.Helper()
	h, err := cl100kHF()
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

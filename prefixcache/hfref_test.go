package prefixcache

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	"github.com/gpurouter/gpurouter/bench/tokens"
	"golang.org/x/text/unicode/norm"
)

// refBPE is a straightforward byte-level BPE, the reference the loader is
// checked against on a vocabulary trained in the test: merges by rank,
// applied to a piece's byte strings by repeatedly merging the lowest-ranked
// adjacent pair, leftmost first.
type refBPE struct {
	vocab  map[string]uint32 // token bytes → id
	ranks  map[[2]string]int // merge → rank
	merges [][2]string       // in rank order
	added  map[string]uint32 // non-special added tokens
	split  *regexp2.Regexp   // GPT-2's
	extra  map[string]uint32 // special added tokens (text to the tokenizer)
}

// trainRefBPE learns n merges from corpus: each step merges the most
// frequent adjacent pair over the corpus's pieces (the smaller pair on a
// tie).
func trainRefBPE(corpus string, n int) *refBPE {
	r := &refBPE{vocab: map[string]uint32{}, ranks: map[[2]string]int{}, split: regexp2.MustCompile(gpt2Split)}
	for b := range 256 {
		r.vocab[string([]byte{byte(b)})] = uint32(b)
	}
	var words [][]string
	for _, p := range r.pieces(" " + corpus) {
		var w []string
		for i := 0; i < len(p); i++ {
			w = append(w, p[i:i+1])
		}
		words = append(words, w)
	}
	for range n {
		count := map[[2]string]int{}
		for _, w := range words {
			for i := 0; i+1 < len(w); i++ {
				count[[2]string{w[i], w[i+1]}]++
			}
		}
		if len(count) == 0 {
			break
		}
		pairs := slices.SortedFunc(maps.Keys(count), func(a, b [2]string) int {
			if count[a] != count[b] {
				return count[b] - count[a]
			}
			return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1])
		})
		best := pairs[0]
		r.ranks[best] = len(r.merges)
		r.merges = append(r.merges, best)
		if _, ok := r.vocab[best[0]+best[1]]; !ok {
			r.vocab[best[0]+best[1]] = uint32(len(r.vocab))
		}
		for wi, w := range words {
			words[wi] = mergeAll(w, best)
		}
	}
	return r
}

func mergeAll(w []string, p [2]string) []string {
	out := w[:0:0]
	for i := 0; i < len(w); i++ {
		if i+1 < len(w) && w[i] == p[0] && w[i+1] == p[1] {
			out = append(out, p[0]+p[1])
			i++
			continue
		}
		out = append(out, w[i])
	}
	return out
}

// pieces is GPT-2's split of text.
func (r *refBPE) pieces(text string) []string {
	var out []string
	m, _ := r.split.FindStringMatch(text)
	for m != nil {
		out = append(out, m.String())
		m, _ = r.split.FindNextMatch(m)
	}
	return out
}

// encode is the reference tokenization: NFC, the non-special added
// tokens cut out (leftmost, longest), a space before each other segment,
// GPT-2's split, then BPE.
func (r *refBPE) encode(text string) []uint32 {
	text = norm.NFC.String(text)
	var ids []uint32
	for text != "" {
		at, tok := len(text), ""
		for s := range r.added {
			i := strings.Index(text, s)
			if i >= 0 && (i < at || i == at && len(s) > len(tok)) {
				at, tok = i, s
			}
		}
		if seg := text[:at]; seg != "" {
			if seg[0] != ' ' {
				seg = " " + seg
			}
			for _, p := range r.pieces(seg) {
				ids = r.bpe(ids, p)
			}
		}
		if tok == "" {
			break
		}
		ids = append(ids, r.added[tok])
		text = text[at+len(tok):]
	}
	return ids
}

func (r *refBPE) bpe(ids []uint32, piece string) []uint32 {
	var w []string
	for i := 0; i < len(piece); i++ {
		w = append(w, piece[i:i+1])
	}
	for {
		best, at := -1, -1
		for i := 0; i+1 < len(w); i++ {
			if rk, ok := r.ranks[[2]string{w[i], w[i+1]}]; ok && (best < 0 || rk < best) {
				best, at = rk, i
			}
		}
		if at < 0 {
			break
		}
		w = append(w[:at], append([]string{w[at] + w[at+1]}, w[at+2:]...)...)
	}
	for _, s := range w {
		ids = append(ids, r.vocab[s])
	}
	return ids
}

// json is the reference as a tokenizer.json: GPT-2's ByteLevel with a
// prefix space, NFC in a Sequence, merges as pairs, ignore_merges off.
func (r *refBPE) json(t *testing.T) []byte {
	vocab := map[string]uint32{}
	for s, id := range r.vocab {
		vocab[toByteLevel(s)] = id
	}
	var merges [][2]string
	for _, m := range r.merges {
		merges = append(merges, [2]string{toByteLevel(m[0]), toByteLevel(m[1])})
	}
	var added []map[string]any
	for s, id := range r.added {
		added = append(added, map[string]any{"id": id, "content": s, "special": false})
	}
	for s, id := range r.extra {
		added = append(added, map[string]any{"id": id, "content": s, "special": true})
	}
	data, err := json.Marshal(map[string]any{
		"added_tokens":  added,
		"normalizer":    map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFC"}}},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true},
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "ignore_merges": false, "vocab": vocab, "merges": merges},
	})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestHFMatchesReferenceBPE: on a vocabulary of 400 merges trained here,
// with GPT-2's own split, a prefix space, NFC and added tokens that are
// not special, the loader's ids are the reference's.
func TestHFMatchesReferenceBPE(t *testing.T) {
	est, _ := tokens.New()
	train := est.Synthesize(4000, 11) + " func main() { x := 42 } // café 日本語"
	ref := trainRefBPE(train, 400)
	ref.added = map[string]uint32{"<tool_call>": 5000, "<tool": 5001}
	ref.extra = map[string]uint32{"<|im_end|>": 5002}
	h, err := ParseHF(ref.json(t))
	if err != nil {
		t.Fatal(err)
	}
	corpus := append(hfCorpus(), est.Synthesize(2000, 12),
		"call <tool_call>{\"a\":1}</tool_call> and <tool and <|im_end|>",
		"cafe\u0301 decomposed, café composed")
	if _, err := h.ChatTemplate(); !errors.Is(err, ErrNoChatMarkers) {
		t.Fatalf("ChatTemplate of a file without chat tokens: %v", err)
	}
	for _, text := range corpus {
		if !utf8.ValidString(text) {
			continue // the reference splits bytes, not runes
		}
		got, want := h.AppendTokens(nil, text), ref.encode(text)
		if !slices.Equal(got, want) {
			t.Errorf("%.40q: ids differ\n got %v\nwant %v", text, got, want)
		}
	}
}

// TestParseHFRefuses: what the loader does not reproduce is an error,
// never ids of another tokenization.
func TestParseHFRefuses(t *testing.T) {
	ref := trainRefBPE("hello hello world", 5)
	var base map[string]any
	if err := json.Unmarshal(ref.json(t), &base); err != nil {
		t.Fatal(err)
	}
	model := func(k string, v any) map[string]any {
		m := maps.Clone(base["model"].(map[string]any))
		m[k] = v
		return map[string]any{"model": m}
	}
	for _, tc := range []struct {
		name   string
		change map[string]any
		want   string
	}{
		{"unigram", model("type", "Unigram"), `model.type "Unigram"`},
		{"wordpiece", model("type", "WordPiece"), `model.type "WordPiece"`},
		{"byte fallback", model("byte_fallback", true), "byte_fallback"},
		{"dropout", model("dropout", 0.1), "dropout"},
		{"subword prefix", model("continuing_subword_prefix", "##"), "continuing_subword_prefix"},
		{"nfkc", map[string]any{"normalizer": map[string]any{"type": "NFKC"}}, `normalizer "NFKC"`},
		{"lowercase", map[string]any{"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "Lowercase"}}}}, `normalizer "Lowercase"`},
		{"metaspace", map[string]any{"pre_tokenizer": map[string]any{"type": "Metaspace"}}, `pre_tokenizer "Metaspace"`},
		{"no byte level", map[string]any{"pre_tokenizer": map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\s+`}, "behavior": "Isolated"}}, "no ByteLevel"},
		{"split removed", map[string]any{"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\s+`}, "behavior": "Removed"},
			map[string]any{"type": "ByteLevel"}}}}, "behavior \"Removed\""},
		{"sentencepiece decoder", map[string]any{"decoder": map[string]any{"type": "Metaspace"}}, `decoder "Metaspace"`},
		{"merge not in vocab", model("merges", []any{toByteLevel(ref.merges[0][0]) + " " + toByteLevel(ref.merges[0][1]), "x y"}), "model.merges[1]"},
		{"bad merge", model("merges", []any{"h e l"}), "model.merges[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := maps.Clone(base)
			maps.Copy(f, tc.change)
			data, _ := json.Marshal(f)
			_, err := ParseHF(data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseHF = %v, want %q", err, tc.want)
			}
			if strings.HasPrefix(tc.name, "merge") || tc.name == "bad merge" {
				return
			}
			if !errors.Is(err, ErrUnsupportedTokenizer) {
				t.Fatalf("%v is not ErrUnsupportedTokenizer", err)
			}
		})
	}
}

// TestHFConcurrentUse: one HF serves many goroutines (its scratch is
// pooled, its tables read-only); run with -race.
func TestHFConcurrentUse(t *testing.T) {
	est, _ := tokens.New()
	ref := trainRefBPE(est.Synthesize(1500, 21), 200)
	h, err := ParseHF(ref.json(t))
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{est.Synthesize(800, 22), strings.Repeat("-=", 100) + " tail", "short text"}
	want := make([][]uint32, len(texts))
	for i, s := range texts {
		want[i] = ref.encode(s)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				k := (g + i) % len(texts)
				if got := h.AppendTokens(nil, texts[k]); !slices.Equal(got, want[k]) {
					t.Errorf("goroutine %d: text %d differs", g, k)
					return
				}
			}
		})
	}
	wg.Wait()
}

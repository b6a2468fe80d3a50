package prefixcache

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"

	"github.com/gpurouter/gpurouter/bench/tokens"
)

// hfCorpus is text of every kind a prompt carries.
func hfCorpus() []string {
	rng := rand.New(rand.NewPCG(1, 2))
	letters := make([]byte, 700)
	for i := range letters {
		letters[i] = byte('a' + rng.IntN(26))
	}
	noise := make([]byte, 300)
	for i := range noise {
		noise[i] = byte(rng.IntN(256))
	}
	return []string{
		"Hello, world! The quick brown fox jumps over the lazy dog.",
		"I'm sure they'll say it's what we've done; YOU'RE RIGHT, HE'D NOT.",
		"func main() {\n\tfmt.Println(\"hi\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i\n\t}\n}\n",
		"def f(x):\n    return x ** 2  # square\n\n\n\nclass A:\n        pass\n",
		"    leading and trailing spaces    ",
		"tabs\t\t\tand\r\nCRLF\r\n\r\n  \n \n",
		"1234567890 3.14159 1,000,000 0x1F 2026-12-07T08:35:50Z",
		"日本語のテキストと中文文本，还有한국어 텍스트。",
		"emoji 🎉🚀👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵, ZWJ and variation ❤️",
		"Ünïcödé ñ ß ø å é – — “quotes” …",
		"ignore <|im_end|> and <|im_start|>system\nnot a turn<|endoftext|>",
		"invalid \xff\xfe bytes \xc3 here \xe2\x82",
		strings.Repeat("=-", 120) + "\n" + strings.Repeat("!", 90),
		string(letters),
		string(noise),
		strings.Repeat(" ", 200) + "x",
		"",
	}
}

// TestHFMatchesTiktokenCL100K: the loader, given cl100k_base as a
// tokenizer.json, computes tiktoken-go's ids, byte for byte.
func TestHFMatchesTiktokenCL100K(t *testing.T) {
	h := loadCL100KHF(t)
	bpe, _ := NewBPE("cl100k_base")
	est, _ := tokens.New()
	corpus := append(hfCorpus(), est.Synthesize(3000, 3))
	for _, text := range corpus {
		got := h.AppendTokens(nil, text)
		want := bpe.AppendTokens(nil, text)
		if !slices.Equal(got, want) {
			t.Errorf("%.40q: ids differ\n got %v\nwant %v", text, got, want)
		}
	}
}

// interpretedCL100KHF is the cl100k equivalent with its split pattern
// spelled so that regexp2 interprets it, as it does the patterns
// tiktoken-go generated no code for (Qwen2's).
func interpretedCL100KHF(tb testing.TB) *HF {
	tb.Helper()
	pre := map[string]any{"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(?:" + cl100kSplit + ")"}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
	}}}
	data, err := cl100kJSON(chatMLTokens, pre)
	if err != nil {
		tb.Fatal(err)
	}
	h, err := ParseHF(data)
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

// TestHFInterpretedSplitMatches: regexp2's interpreter splits as the
// code generated for the same pattern does.
func TestHFInterpretedSplitMatches(t *testing.T) {
	h := interpretedCL100KHF(t)
	bpe, _ := NewBPE("cl100k_base")
	for _, text := range hfCorpus() {
		if got, want := h.AppendTokens(nil, text), bpe.AppendTokens(nil, text); !slices.Equal(got, want) {
			t.Errorf("%.40q: ids differ\n got %v\nwant %v", text, got, want)
		}
	}
}

// TestHFChatMatchesCL100KChat: the simulator's rendering over the loaded
// tokenizer is the one over the embedded vocabulary.
func TestHFChatMatchesCL100KChat(t *testing.T) {
	h := loadCL100KHF(t)
	bpe, _ := NewBPE("cl100k_base")
	msgs := []Message{{"system", "You are terse."}, {"user", "Hi <|im_end|> there\n\n  "}, {"assistant", "Sure."}, {"user", "again"}}
	got := CL100KChat().AppendChat(nil, h, msgs)
	want := CL100KChat().AppendChat(nil, bpe, msgs)
	if !slices.Equal(got, want) {
		t.Fatalf("rendering differs\n got %v\nwant %v", got, want)
	}
}

// renderSplit tokenizes a rendered prompt as an engine does: its special
// tokens are their ids, the text between them is tokenized as one.
func renderSplit(tok Tokenizer, prompt string, special map[string]uint32) []uint32 {
	var ids []uint32
	for prompt != "" {
		at, which := len(prompt), ""
		for s := range special {
			if i := strings.Index(prompt, s); i >= 0 && i < at {
				at, which = i, s
			}
		}
		ids = tok.AppendTokens(ids, prompt[:at])
		if which == "" {
			break
		}
		ids = append(ids, special[which])
		prompt = prompt[at+len(which):]
	}
	return ids
}

var hfChatMsgs = []Message{{"system", "You are terse."}, {"user", "\nHello,\n  world "}, {"assistant", "Hi."}, {"user", "日本語 🎉"}}

// TestHFChatTemplateChatML: a file with ChatML's tokens renders as
// Qwen's template does, tokenized as the engine tokenizes the rendered
// string.
func TestHFChatTemplateChatML(t *testing.T) {
	h := loadCL100KHF(t)
	ct, err := h.ChatTemplate()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, m := range hfChatMsgs {
		b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
	}
	b.WriteString("<|im_start|>assistant\n")
	bpe, _ := NewBPE("")
	want := renderSplit(bpe, b.String(), chatMLTokens)
	if got := ct.AppendChat(nil, h, hfChatMsgs); !slices.Equal(got, want) {
		t.Fatalf("rendering differs\n got %v\nwant %v", got, want)
	}
	if p := ct.AppendPrompt(nil, h, "abc"); !slices.Equal(p, bpe.AppendTokens(nil, "abc")) {
		t.Fatalf("a prompt without a post-processor: %v", p)
	}
}

// TestHFChatTemplateLlama3: Llama 3's tokens render as its template does
// (contents trimmed), and its post-processor's BOS leads a completion's
// prompt.
func TestHFChatTemplateLlama3(t *testing.T) {
	special := map[string]uint32{"<|begin_of_text|>": 100300, "<|start_header_id|>": 100301,
		"<|end_header_id|>": 100302, "<|eot_id|>": 100303}
	post := map[string]any{"post_processor": map[string]any{"type": "Sequence", "processors": []any{
		map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
		map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair": []any{}, "special_tokens": map[string]any{}},
	}}}
	data, err := cl100kJSON(special, post)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ParseHF(data)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := h.ChatTemplate()
	if err != nil {
		t.Fatal(err)
	}
	b := strings.Builder{}
	b.WriteString("<|begin_of_text|>")
	for _, m := range hfChatMsgs {
		b.WriteString("<|start_header_id|>" + m.Role + "<|end_header_id|>\n\n" + strings.TrimSpace(m.Content) + "<|eot_id|>")
	}
	b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	bpe, _ := NewBPE("")
	want := renderSplit(bpe, b.String(), special)
	if got := ct.AppendChat(nil, h, hfChatMsgs); !slices.Equal(got, want) {
		t.Fatalf("rendering differs\n got %v\nwant %v", got, want)
	}
	want = append([]uint32{100300}, bpe.AppendTokens(nil, "Once upon")...)
	if got := ct.AppendPrompt(nil, h, "Once upon"); !slices.Equal(got, want) {
		t.Fatalf("prompt %v, want %v", got, want)
	}
}

// TestHFMergeHeapIsScan: long pieces merge by a heap, short ones by a
// scan; both give the same ids.
func TestHFMergeHeapIsScan(t *testing.T) {
	h := loadCL100KHF(t)
	rng := rand.New(rand.NewPCG(3, 4))
	var s bpeScratch
	for range 300 {
		n := 1 + rng.IntN(200)
		piece := make([]byte, n)
		alphabet := "aeiou  tnrshd.,=-\n"
		for i := range piece {
			piece[i] = alphabet[rng.IntN(len(alphabet))]
		}
		var ids []uint32
		for _, b := range piece {
			ids = append(ids, h.byteIDs[b])
		}
		scan := slices.Clone(h.merges.mergeScan(&s, slices.Clone(ids)))
		heap := h.merges.mergeHeap(&s, slices.Clone(ids))
		if !slices.Equal(scan, heap) {
			t.Fatalf("%q: scan %v heap %v", piece, scan, heap)
		}
	}
}

func TestByteLevelAlphabetInverts(t *testing.T) {
	a := byteLevelAlphabet()
	for b := range 256 {
		if got, ok := byteOfRune(a[b]); !ok || got != byte(b) {
			t.Fatalf("byte %#x → %U → %#x %v", b, a[b], got, ok)
		}
	}
	if _, ok := byteOfRune(256 + 68); ok {
		t.Fatal("a rune past the alphabet reads as a byte")
	}
}

// TestLoadHFFileErrorsNameThePath: a missing file, a refused one.
func TestLoadHFFileErrorsNameThePath(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.json")
	if _, err := LoadHF(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing file: %v", err)
	}
	p := filepath.Join(dir, "tokenizer.json")
	if err := os.WriteFile(p, []byte(`{"model":{"type":"Unigram","vocab":[["a",0.0]]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadHF(p)
	if !errors.Is(err, ErrUnsupportedTokenizer) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "Unigram") {
		t.Fatalf("unigram: %v", err)
	}
}

// BenchmarkHFTokenize32k is the loaded cl100k equivalent over a
// 32k-token prompt, beside BenchmarkBPETokenize32k (tiktoken-go) over the
// same text.
func BenchmarkHFTokenize32k(b *testing.B) {
	benchTokenize32k(b, loadCL100KHF(b))
}

func BenchmarkBPETokenize32k(b *testing.B) {
	bpe, _ := NewBPE("")
	benchTokenize32k(b, bpe)
}

func benchTokenize32k(b *testing.B, tok Tokenizer) {
	est, _ := tokens.New()
	text := est.Synthesize(32000, 7)
	var ids []uint32
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		ids = tok.AppendTokens(ids[:0], text)
	}
	perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(perOp/float64(len(ids))*1000, "ns/1k-tokens")
	b.ReportMetric(float64(len(ids)), "tokens")
}

// FuzzHFMatchesTiktoken: for any text a client may send the loader never
// panics, and its ids over cl100k_base as a tokenizer.json are
// tiktoken-go's wherever tiktoken-go splits the text as a backtracking
// engine does. Where it does not (TestHFSplitsAsTokenizersDoes), the
// pieces differ and so may the ids.
func FuzzHFMatchesTiktoken(f *testing.F) {
	for _, s := range hfCorpus() {
		f.Add(s)
	}
	h := loadCL100KHF(f)
	bpe, _ := NewBPE("cl100k_base")
	generated := regexp2.MustCompile(cl100kSplit) // tiktoken-go's registered code
	interpreted := regexp2.MustCompile(cl100kSplit, splitOptions()...)
	f.Fuzz(func(t *testing.T, text string) {
		got := h.AppendTokens(nil, text)
		if !utf8.ValidString(text) {
			return // both read it with U+FFFD for the bad bytes: TestHFMatchesTiktokenCL100K
		}
		g, err1 := generated.FindAllStringIndex(text, -1)
		i, err2 := interpreted.FindAllStringIndex(text, -1)
		if err1 != nil || err2 != nil || !slices.EqualFunc(g, i, slices.Equal) {
			return
		}
		if want := bpe.AppendTokens(nil, text); !slices.Equal(got, want) {
			t.Fatalf("%q: ids differ\n got %v\nwant %v", text, got, want)
		}
	})
}

// TestHFSplitsAsTokenizersDoes: the loader splits as Hugging Face's
// tokenizers (Oniguruma, backtracking) and tiktoken (fancy-regex) do, not
// as the code tiktoken-go generated for the same patterns, which the
// engines do not run: "\n \n" before a digit is one piece (\s*[\r\n]+
// backtracks one space), and DEL is byte 0x7f's token, not dropped.
func TestHFSplitsAsTokenizersDoes(t *testing.T) {
	h := loadCL100KHF(t)
	for _, tc := range []struct {
		text string
		want []uint32
	}{
		{"0000\n \n0", []uint32{931, 15, 27907, 15}}, // "000" "0" "\n \n" "0"
		{"\x7f", []uint32{221}},
	} {
		if got := h.AppendTokens(nil, tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("%q: ids %v, want %v", tc.text, got, tc.want)
		}
	}
}

package prefixcache

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	"golang.org/x/text/unicode/norm"
)

// HF is a Tokenizer loaded from a model's Hugging Face tokenizer.json:
// byte-level BPE (GPT-2, Llama 3, Qwen2 and their kin), the vocabulary an
// engine serving that model tokenizes with. Pure Go; the file is read once.
// Safe for concurrent use. Build with LoadHF or ParseHF; the zero value is
// not usable.
//
// What it does as the file says: the NFC normalizer (or none); the
// pre-tokenizers ByteLevel (with its GPT-2 split and add_prefix_space)
// and Split on a regex or string (behavior Isolated), alone or in a
// Sequence; the model's vocab, merges (either spelling) and
// ignore_merges. Added tokens that are not special (Qwen's <tool_call>)
// are matched in text, as the engine matches them; special ones
// (<|im_end|>) are text like any other, as in BPE.AppendTokens. Anything
// else — Unigram or WordPiece models, other normalizers, BPE dropout,
// byte fallback, word prefixes and suffixes — is refused at load, so that
// a pool never keys its index by ids the engine does not compute.
type HF struct {
	path         string
	nfc          bool              // normalize to NFC first
	stages       []splitStage      // pre-tokenizers, in order
	byteIDs      [256]uint32       // each byte's symbol
	hasByte      [256]bool         // false only for bytes valid UTF-8 never holds
	vocab        map[string]uint32 // token bytes (not byte-level text) → id
	merges       mergeTable        // by pair of ids
	ignoreMerges bool              // a piece in vocab is one token
	added        []addedToken      // non-special added tokens, matched in text
	addedIDs     map[string]uint32 // every added token by content
	prompt       []uint32          // the post-processor's ids before a single prompt
	scratch      sync.Pool         // *bpeScratch
}

// splitStage is one pre-tokenizer: a split of each piece by re (nil:
// none), each piece first given a leading space when prefixSpace and it
// has none.
type splitStage struct {
	re          *regexp2.Regexp
	prefixSpace bool
}

// addedToken is an added token and its id.
type addedToken struct {
	content string
	id      uint32
}

// gpt2Split is ByteLevel's own split, when use_regex is on.
const gpt2Split = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// ErrUnsupportedTokenizer says a tokenizer.json uses something HF does
// not implement; tokenizing with it would give other ids than the
// engine's.
var ErrUnsupportedTokenizer = errors.New("unsupported tokenizer.json")

// LoadHF reads and parses a tokenizer.json file (ParseHF). Errors name
// the path.
func LoadHF(path string) (*HF, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("prefixcache: tokenizer %s: %w", path, err)
	}
	t, err := ParseHF(data)
	if err != nil {
		return nil, fmt.Errorf("prefixcache: tokenizer %s: %w", path, err)
	}
	t.path = path
	return t, nil
}

// Name is the file the tokenizer was loaded from ("" when parsed from
// bytes).
func (t *HF) Name() string { return t.path }

// AppendTokens implements Tokenizer.
func (t *HF) AppendTokens(dst []uint32, text string) []uint32 {
	if text == "" {
		return dst
	}
	if !utf8.ValidString(text) {
		// Each invalid byte becomes U+FFFD, as the regex engine (over
		// runes) and tiktoken-go see it; an engine only ever gets valid
		// UTF-8 from its JSON.
		text = string([]rune(text))
	}
	if t.nfc {
		text = norm.NFC.String(text)
	}
	s, _ := t.scratch.Get().(*bpeScratch)
	if s == nil {
		s = &bpeScratch{}
	}
	for text != "" {
		at, tok := t.nextAdded(text)
		dst = t.appendSplit(dst, s, text[:at], 0)
		if tok == nil {
			break
		}
		dst = append(dst, tok.id)
		text = text[at+len(tok.content):]
	}
	t.scratch.Put(s)
	return dst
}

// nextAdded is the first non-special added token in text (the longest of
// those starting there) and where it starts; len(text) and nil if none.
func (t *HF) nextAdded(text string) (int, *addedToken) {
	at, best := len(text), (*addedToken)(nil)
	for i := range t.added {
		a := &t.added[i]
		j := strings.Index(text[:min(len(text), at+len(a.content))], a.content)
		if j < 0 || j > at || j == at && best != nil && len(a.content) <= len(best.content) {
			continue
		}
		at, best = j, a
	}
	return at, best
}

// appendSplit splits text by the pre-tokenizers from stage on and appends
// each piece's BPE ids.
func (t *HF) appendSplit(dst []uint32, s *bpeScratch, text string, stage int) []uint32 {
	if text == "" {
		return dst
	}
	if stage == len(t.stages) {
		return t.appendPiece(dst, s, text)
	}
	st := t.stages[stage]
	if st.prefixSpace && text[0] != ' ' {
		text = " " + text
	}
	if st.re == nil {
		return t.appendSplit(dst, s, text, stage+1)
	}
	// Isolated: a match is a piece, and so is the text between matches.
	idx, err := st.re.FindAllStringIndex(text, -1)
	if err != nil { // only a match timeout, and none is set
		return t.appendSplit(dst, s, text, stage+1)
	}
	prev := 0
	for _, m := range idx {
		dst = t.appendSplit(dst, s, text[prev:m[0]], stage+1)
		dst = t.appendSplit(dst, s, text[m[0]:m[1]], stage+1)
		prev = m[1]
	}
	return t.appendSplit(dst, s, text[prev:], stage+1)
}

// appendPiece appends one pre-tokenized piece's BPE ids.
func (t *HF) appendPiece(dst []uint32, s *bpeScratch, piece string) []uint32 {
	if t.ignoreMerges {
		if id, ok := t.vocab[piece]; ok {
			return append(dst, id)
		}
	}
	ids := s.ids[:0]
	for i := 0; i < len(piece); i++ {
		if b := piece[i]; t.hasByte[b] {
			ids = append(ids, t.byteIDs[b])
		}
	}
	if len(ids) < heapMinSymbols {
		ids = t.merges.mergeScan(s, ids)
	} else {
		ids = t.merges.mergeHeap(s, ids)
	}
	s.ids = ids
	return append(dst, ids...)
}

// PromptPrefix is the ids the file's post-processor puts before a single
// sequence (Llama 3's <|begin_of_text|>), which an engine adds to a
// completion's prompt; empty when it adds none.
func (t *HF) PromptPrefix() []uint32 { return t.prompt }

// fromByteLevel is the bytes a byte-level token string stands for; "" if
// it has a character outside the alphabet.
func fromByteLevel(s string) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		v, ok := byteOfRune(r)
		if !ok {
			return ""
		}
		b = append(b, v)
	}
	return string(b)
}

// byteOfRune inverts byteLevelAlphabet.
func byteOfRune(r rune) (byte, bool) {
	switch {
	case r >= '!' && r <= '~', r >= 0xA1 && r <= 0xAC, r >= 0xAE && r <= 0xFF:
		return byte(r), true
	case r >= 256 && r < 256+68:
		// The 68 unprintable bytes, in order: 0x00-0x20, 0x7F-0xA0, 0xAD.
		n := int(r - 256)
		switch {
		case n <= 0x20:
			return byte(n), true
		case n <= 0x20+0x22:
			return byte(0x7F + n - 0x21), true
		default:
			return 0xAD, true
		}
	}
	return 0, false
}

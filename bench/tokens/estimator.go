// Package tokens estimates token counts the way an engine's tokenizer would,
// with a real BPE vocabulary embedded in the binary (cl100k_base via
// tiktoken-go), so no file or network is needed at run time.
//
// The benchmark and the simulator (bench/sim) count with this one package,
// so a prompt the benchmark synthesises to N tokens is N tokens to the
// simulator. The router does not use it: its admission control estimates a
// prompt from its size in bytes (bytes/4) and corrects that raw estimate by
// a ratio it learns from the token counts the engine reports
// (admission.Estimator), so it needs no vocabulary for the served model.
package tokens

import (
	"fmt"
	"strings"

	"github.com/tiktoken-go/tokenizer"
)

// Chat-template overheads, in tokens. Chat templates wrap every message in
// role markers and separators; OpenAI documents 3 tokens per message plus 3
// to prime the reply for its own models, and Llama/Qwen templates land within
// a few tokens of that.
const (
	PerMessageOverhead = 3
	ReplyPriming       = 3
)

// Message is one chat message as far as counting is concerned.
type Message struct {
	Role    string
	Content string
}

// Estimator counts tokens. It is safe for concurrent use. The zero value is
// not usable: build one with New.
type Estimator struct {
	codec tokenizer.Codec
}

// New returns an Estimator over the cl100k_base vocabulary.
func New() (*Estimator, error) {
	c, err := tokenizer.Get(tokenizer.Cl100kBase)
	if err != nil {
		return nil, fmt.Errorf("tokens: load cl100k_base: %w", err)
	}
	return &Estimator{codec: c}, nil
}

// Count returns the number of tokens in text. Invalid UTF-8 is counted as
// replacement characters rather than failing: an estimate must always exist.
func (e *Estimator) Count(text string) int {
	if text == "" {
		return 0
	}
	n, err := e.codec.Count(text)
	if err != nil {
		// Only strict error mode returns errors; fall back to a byte-based
		// estimate (≈4 bytes per token for English) rather than zero.
		return (len(text) + 3) / 4
	}
	return n
}

// CountChat returns the prompt size of a chat request: every message's
// content and role plus the template overhead.
func (e *Estimator) CountChat(msgs []Message) int {
	n := ReplyPriming
	for _, m := range msgs {
		n += PerMessageOverhead + e.Count(m.Role) + e.Count(m.Content)
	}
	return n
}

// fillerWords are words that are exactly one cl100k_base token each when
// preceded by a space, so a prompt of n of them is n tokens (checked by
// TestSynthesizeExact).
var fillerWords = [...]string{
	" the", " of", " and", " to", " in", " is", " that", " for", " it", " as",
	" with", " was", " on", " be", " at", " by", " this", " had", " not", " are",
	" but", " from", " or", " have", " an", " they", " which", " one", " you", " were",
	" her", " all", " she", " there", " would", " their", " we", " him", " been", " has",
	" when", " who", " will", " more", " no", " if", " out", " so", " said", " what",
	" up", " its", " about", " into", " than", " them", " can", " only", " other", " new",
	" some", " could", " time", " these",
}

// Synthesize returns deterministic text of exactly n tokens under this
// estimator. seed varies the word sequence so that different prompts don't
// share a prefix (which would trip prefix caching in engines) unless the
// caller wants them to.
func (e *Estimator) Synthesize(n int, seed uint64) string {
	if n <= 0 {
		return ""
	}
	var b strings.Builder
	b.Grow(n * 5)
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := 0; i < n; i++ {
		// xorshift64: cheap, deterministic, good enough to avoid runs.
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b.WriteString(fillerWords[x%uint64(len(fillerWords))])
	}
	return b.String()
}

// Encode returns the token ids of text, for checks that need the token
// sequence rather than its length. Invalid UTF-8 gives nil.
func (e *Estimator) Encode(text string) []uint {
	ids, _, err := e.codec.Encode(text)
	if err != nil {
		return nil
	}
	return ids
}

// blockIDWords is how many leading filler words spell a block's id: 64
// words, 6 bits each, so 11 of them tell any two 64-bit ids apart.
const blockIDWords = 11

// AppendBlock appends the first n tokens of the text of block id: a
// deterministic run of one-token filler words (so n of them are exactly n
// tokens, and blocks appended one after another are the sum of their
// tokens). The same id always gives the same words, and a shorter n a
// prefix of a longer one. The first 11 words spell a bijective mix of the
// id in base 64, so two different ids differ within their first 11 tokens
// (usually at the first) — less than one 16-token KV block — and a prefix
// cache that hashes blocks of tokens sees exactly the ids two prompts share.
func (e *Estimator) AppendBlock(dst []byte, id uint64, n int) []byte {
	m := mixBlockID(id)
	x := m | 1 // xorshift state for the words after the id's; never 0
	for i := 0; i < n; i++ {
		var w uint64
		if i < blockIDWords {
			w = (m >> (6 * i)) & 63
		} else {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			w = x % uint64(len(fillerWords))
		}
		dst = append(dst, fillerWords[w]...)
	}
	return dst
}

// mixBlockID is a bijection of uint64 (splitmix64's finaliser), so
// neighbouring ids differ in their first words as often as unrelated ones.
func mixBlockID(id uint64) uint64 {
	id += 0x9E3779B97F4A7C15
	id = (id ^ id>>30) * 0xBF58476D1CE4E5B9
	id = (id ^ id>>27) * 0x94D049BB133111EB
	return id ^ id>>31
}

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

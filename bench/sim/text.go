package sim

import (
	"strconv"
	"strings"
)

// Generated text is a walk through the filler vocabulary (fillerWords): each
// word is the previous one plus a stride, and the first follows from the
// last word of the context. Start and stride depend only on the request's
// seed and its context, never on which replica serves it or when, so a
// continuation — the prompt plus the text generated so far (or their token
// ids), as a router sends it to another replica after the first one died —
// goes on with exactly the words an uninterrupted run would have produced.
// Without a seed the request's random salt stands in, as vLLM samples
// differently on every request without one.

// vocabBase is the token id of vocabulary word 0: generated tokens are
// vocabBase+k, apart from the stand-in ids (1000…30999) that /tokenize and
// prompt_token_ids give prompt text, so a token-id prompt that ends in a
// generated token is recognised as a continuation.
const vocabBase = 40000

// contextEnd is the last token of a request's context: a word of its text,
// or a token id of a token-id prompt.
type contextEnd struct {
	word string
	id   int
	isID bool
}

// lastWord is the last whitespace-separated word of text ("" when none).
func lastWord(text string) string {
	text = strings.TrimRight(text, " \t\r\n")
	if i := strings.LastIndexAny(text, " \t\r\n"); i >= 0 {
		return text[i+1:]
	}
	return text
}

// textGen is where a request's walk through the vocabulary stands.
type textGen struct {
	next int // index of the next word
	step int // stride, coprime with the vocabulary's size (0 reads as 1)
}

// newTextGen starts the walk of a request with seed whose context ends with
// end: the word after a vocabulary word is the walk's next one from it;
// after anything else it is drawn from the seed and that token.
func newTextGen(vocab map[string]int, size int, seed uint64, end contextEnd) textGen {
	if size < 2 {
		return textGen{step: 1}
	}
	step := 1 + int(mix64(seed, 0x57e9)%uint64(size-1))
	for gcd(step, size) != 1 {
		step = step%(size-1) + 1
	}
	g := textGen{step: step}
	var k int
	var ok bool
	var h uint64
	if end.isID {
		k, ok = end.id-vocabBase, end.id >= vocabBase && end.id < vocabBase+size
		h = uint64(end.id)
	} else {
		k, ok = vocab[end.word]
		h = fnvOffset
		for i := 0; i < len(end.word); i++ {
			h = (h ^ uint64(end.word[i])) * fnvPrime
		}
	}
	if ok {
		g.next = (k + step) % size
	} else {
		g.next = int(mix64(seed, h) % uint64(size))
	}
	return g
}

// word returns the index of the next word and moves on.
func (g *textGen) word(size int) int {
	k := g.next
	step := g.step
	if step == 0 {
		step = 1
	}
	g.next = (g.next + step) % size
	return k
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// vocabIndex maps each filler word, without its leading space, to its index.
func vocabIndex(words [][]byte) map[string]int {
	m := make(map[string]int, len(words))
	for i, w := range words {
		m[strings.TrimSpace(string(w))] = i
	}
	return m
}

// appendIDList appends ids as a JSON array.
func appendIDList(b []byte, ids []int) []byte {
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	return append(b, ']')
}

// appendPromptIDs appends the prompt's token ids as a JSON array: those the
// request gave, else stand-ins (as /tokenize answers) of the prompt's size.
func (q *request) appendPromptIDs(b []byte) []byte {
	if q.promptIDs != nil {
		return appendIDList(b, q.promptIDs)
	}
	b = append(b, '[')
	for i := 0; i < q.s.prompt; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(1000+i%30000), 10)
	}
	return append(b, ']')
}

// genIDs returns the token ids of the first n generated words.
func (q *request) genIDs(n int) []int {
	g := q.gen0
	ids := make([]int, n)
	for i := range ids {
		ids[i] = vocabBase + g.word(len(q.r.words))
	}
	return ids
}

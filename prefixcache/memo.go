package prefixcache

import (
	"hash/maphash"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// Memo is a Tokenizer that remembers the token ids of the long texts it
// tokenized, so that a text seen again costs a hash and a copy instead
// of a tokenization. Multi-turn chat resends its whole history each turn,
// and a chat prompt is tokenized message by message (ChatTemplate): with
// a Memo only the turn's new messages are tokenized, not the tens of
// thousands of tokens before them (about 1.2 µs a token with cl100k_base).
// What it returns is what the Tokenizer it wraps returns. Safe for
// concurrent use; build it with NewMemo.
type Memo struct {
	tok       Tokenizer
	minBytes  int
	maxTokens int
	seed      maphash.Seed

	mu      sync.Mutex
	entries map[memoKey]*memoEntry
	head    memoEntry // sentinel of the LRU ring: head.next is the most recent
	tokens  int       // Σ len(ids) over entries
}

// memoKey identifies a text by two independent 64-bit hashes and its
// length: a collision that would return another text's ids needs both to
// collide at once.
type memoKey struct {
	h1, h2 uint64
	n      int
}

type memoEntry struct {
	key        memoKey
	ids        []uint32 // never written once stored: readers copy it outside the lock
	prev, next *memoEntry
}

// Defaults of NewMemo's zero arguments.
const (
	// DefaultMemoMinBytes: shorter texts (a role, a short question)
	// tokenize faster than the bookkeeping would save.
	DefaultMemoMinBytes = 1024
	// DefaultMemoMaxTokens bounds what a Memo holds: 4M token ids, 16 MiB,
	// the histories of a few hundred long conversations.
	DefaultMemoMaxTokens = 1 << 22
)

// NewMemo wraps tok: texts of at least minBytes are remembered, at most
// maxTokens token ids in all, the least recently used forgotten first.
// Zero arguments take DefaultMemoMinBytes and DefaultMemoMaxTokens.
func NewMemo(tok Tokenizer, minBytes, maxTokens int) *Memo {
	if minBytes <= 0 {
		minBytes = DefaultMemoMinBytes
	}
	if maxTokens <= 0 {
		maxTokens = DefaultMemoMaxTokens
	}
	m := &Memo{tok: tok, minBytes: minBytes, maxTokens: maxTokens, seed: maphash.MakeSeed(), entries: map[memoKey]*memoEntry{}}
	m.head.prev, m.head.next = &m.head, &m.head
	return m
}

// AppendTokens implements Tokenizer.
func (m *Memo) AppendTokens(dst []uint32, text string) []uint32 {
	if len(text) < m.minBytes {
		return m.tok.AppendTokens(dst, text)
	}
	k := memoKey{h1: maphash.String(m.seed, text), h2: xxhash.Sum64String(text), n: len(text)}
	m.mu.Lock()
	e := m.entries[k]
	if e != nil {
		m.unlink(e)
		m.pushFront(e)
	}
	m.mu.Unlock()
	if e != nil {
		return append(dst, e.ids...)
	}
	ids := m.tok.AppendTokens(nil, text)
	m.store(k, ids)
	return append(dst, ids...)
}

// store remembers ids under k, forgetting the least recently used texts
// until the Memo is within maxTokens. A text longer than half the bound
// is not kept: it would push out most others for one.
func (m *Memo) store(k memoKey, ids []uint32) {
	if len(ids) > m.maxTokens/2 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.entries[k]; ok {
		return // another goroutine tokenized it meanwhile
	}
	e := &memoEntry{key: k, ids: ids}
	m.entries[k] = e
	m.pushFront(e)
	m.tokens += len(ids)
	for m.tokens > m.maxTokens {
		old := m.head.prev
		m.unlink(old)
		delete(m.entries, old.key)
		m.tokens -= len(old.ids)
	}
}

// Len is how many texts the Memo holds, and their token ids in all.
func (m *Memo) Len() (texts, tokens int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries), m.tokens
}

func (m *Memo) unlink(e *memoEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (m *Memo) pushFront(e *memoEntry) {
	e.prev, e.next = &m.head, m.head.next
	m.head.next.prev = e
	m.head.next = e
}

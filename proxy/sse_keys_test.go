package proxy

import (
	"bytes"
	"testing"
)

// Chunks as engines write them, and the shapes the finders must not be
// fooled by: keys inside strings (escaped), letters of the key's name
// everywhere, a key at the very start or end.
var keyChunks = []string{
	`{"id":"chatcmpl-1764182912123456789","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":260,"completion_tokens":255}}`,
	`{"id": "cmpl-2", "choices": [{"text": "usage\": \"choices\":", "finish_reason": "stop"}], "usage": null}`,
	`{"choices":[{"delta":{"content":"\"usage\":{}"}}]}`,
	`"usage":`,
	`usage":"usage":`,
	`uuuuuuu"uusage"usage:"usage":{"x":1}`,
	`{"model":"usage-model","choices":[{"text":"u"}]}`,
	``,
	`"`,
}

// TestIndexKeyIsBytesIndex: indexKey finds what bytes.Index finds, for
// every key the relay and migration look for.
func TestIndexKeyIsBytesIndex(t *testing.T) {
	keys := [][]byte{usageKey, choicesKey, keyContent, keyText, keyFinishReason, keyTokenIDs, keyID, keyReasoning}
	for _, c := range keyChunks {
		b := []byte(c)
		for _, k := range keys {
			if got, want := indexKey(b, k), bytes.Index(b, k); got != want {
				t.Errorf("indexKey(%q, %s) = %d, bytes.Index says %d", c, k, got, want)
			}
		}
	}
}

// TestKeyHintFollowsTheStream: the hint answers from the previous chunk's
// offset when the key is there, searches when it is not (a chunk of
// another shape, an id of another length), and never returns an offset
// without the key.
func TestKeyHintFollowsTheStream(t *testing.T) {
	var h keyHint
	first := []byte(`{"id":"a","choices":[{"delta":{"content":"x"}}]}`)
	if i := h.index(first, choicesKey); i != bytes.Index(first, choicesKey) || h == 0 {
		t.Fatalf("first chunk: %d, hint %d", i, h)
	}
	same := []byte(`{"id":"b","choices":[{"delta":{"content":"longer text"}}]}`)
	if i := h.index(same, choicesKey); i != bytes.Index(same, choicesKey) {
		t.Errorf("same shape: %d", i)
	}
	longerID := []byte(`{"id":"bbbb","choices":[]}`)
	if i := h.index(longerID, choicesKey); i != bytes.Index(longerID, choicesKey) {
		t.Errorf("id of another length: %d, want %d", i, bytes.Index(longerID, choicesKey))
	}
	none := []byte(`{"id":"bbbb","usage":{}}`)
	if i := h.index(none, choicesKey); i != -1 {
		t.Errorf("no choices: %d", i)
	}
	short := []byte(`{}`)
	if i := h.index(short, choicesKey); i != -1 {
		t.Errorf("a chunk shorter than the hint: %d", i)
	}
	var nilHint *keyHint
	if i := nilHint.index(first, choicesKey); i != bytes.Index(first, choicesKey) {
		t.Errorf("nil hint: %d", i)
	}
}

// BenchmarkClassifyEvent is the relay's per-event classification of a
// token chunk, with the stream's choices hint as the relay keeps it.
func BenchmarkClassifyEvent(b *testing.B) {
	p := []byte(keyChunks[0])
	var h chunkHints
	b.ReportAllocs()
	for b.Loop() {
		if classifyEvent(p, &h) != evToken {
			b.Fatal("not a token chunk")
		}
	}
}

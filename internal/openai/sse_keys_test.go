package openai

import (
	"strings"
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

// TestIndexKeyIsBytesIndex: IndexKey finds what bytes.Index finds, for
// every key the relay and migration look for.
func TestIndexKeyIsStringsIndex(t *testing.T) {
	keys := []string{UsageKey, ChoicesKey, KeyContent, KeyText, KeyFinishReason, KeyTokenIDs, KeyID, KeyReasoning}
	for _, c := range keyChunks {
		b := []byte(c)
		for _, k := range keys {
			if got, want := IndexKey(b, k), strings.Index(string(b), k); got != want {
				t.Errorf("IndexKey(%q, %s) = %d, strings.Index says %d", c, k, got, want)
			}
		}
	}
}

// TestKeyHintFollowsTheStream: the hint answers from the previous chunk's
// offset when the key is there, searches when it is not (a chunk of
// another shape, an id of another length), and never returns an offset
// without the key.
func TestKeyHintFollowsTheStream(t *testing.T) {
	var h KeyHint
	first := []byte(`{"id":"a","choices":[{"delta":{"content":"x"}}]}`)
	if i := h.Index(first, ChoicesKey); i != strings.Index(string(first), ChoicesKey) || h == 0 {
		t.Fatalf("first chunk: %d, hint %d", i, h)
	}
	same := []byte(`{"id":"b","choices":[{"delta":{"content":"longer text"}}]}`)
	if i := h.Index(same, ChoicesKey); i != strings.Index(string(same), ChoicesKey) {
		t.Errorf("same shape: %d", i)
	}
	longerID := []byte(`{"id":"bbbb","choices":[]}`)
	if i := h.Index(longerID, ChoicesKey); i != strings.Index(string(longerID), ChoicesKey) {
		t.Errorf("id of another length: %d, want %d", i, strings.Index(string(longerID), ChoicesKey))
	}
	none := []byte(`{"id":"bbbb","usage":{}}`)
	if i := h.Index(none, ChoicesKey); i != -1 {
		t.Errorf("no choices: %d", i)
	}
	short := []byte(`{}`)
	if i := h.Index(short, ChoicesKey); i != -1 {
		t.Errorf("a chunk shorter than the hint: %d", i)
	}
	var nilHint *KeyHint
	if i := nilHint.Index(first, ChoicesKey); i != strings.Index(string(first), ChoicesKey) {
		t.Errorf("nil hint: %d", i)
	}
}

// BenchmarkClassifyEvent is the relay's per-event classification of a
// token chunk, with the stream's choices hint as the relay keeps it.
func BenchmarkClassifyEvent(b *testing.B) {
	p := []byte(keyChunks[0])
	var h ChunkHints
	b.ReportAllocs()
	for b.Loop() {
		if ClassifyEvent(p, &h) != EventToken {
			b.Fatal("not a token chunk")
		}
	}
}

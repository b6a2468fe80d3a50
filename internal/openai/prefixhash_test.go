package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// The prefix hash follows a request's first message: requests sharing a
// system prompt share it whatever follows; without one, the first message's
// first PrefixBytes decide; a message in parts hashes as its first text.
func TestPrefixHashFollowsTheFirstMessage(t *testing.T) {
	chat := func(msgs ...any) []byte {
		var ms []map[string]any
		for i := 0; i < len(msgs); i += 2 {
			ms = append(ms, map[string]any{"role": msgs[i], "content": msgs[i+1]})
		}
		b, err := json.Marshal(map[string]any{"model": "m", "messages": ms})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	hash := func(body []byte) uint64 {
		t.Helper()
		r, err := parseRequest(body, Chat)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return r.PrefixHash
	}
	long := strings.Repeat("a", PrefixBytes)
	sys := hash(chat("system", "You are terse.", "user", "hi"))
	switch {
	case sys == 0:
		t.Fatal("a system prompt hashed to 0 (no prefix)")
	case hash(chat("system", "You are terse.", "user", "something else entirely")) != sys:
		t.Error("one system prompt, two hashes")
	case hash(chat("system", "You are verbose.", "user", "hi")) == sys:
		t.Error("two system prompts, one hash")
	case hash(chat("user", long+"x")) != hash(chat("user", long+"y")):
		t.Error("prompts equal in their first prefixBytes hashed apart")
	case hash(chat("user", "x"+long)) == hash(chat("user", "y"+long)):
		t.Error("prompts that differ in their first byte hashed alike")
	case hash(chat("user", []any{map[string]any{"type": "text", "text": "You are terse."}})) != sys:
		t.Error("a first text part hashed unlike the same string")
	case hash(chat("user", []any{map[string]any{"type": "image_url", "image_url": map[string]any{"url": "u"}}})) != 0:
		t.Error("a message without text has a prefix")
	}
}

// BenchmarkPrefixHash is the prefix hash of a long prompt (PrefixBytes of
// it are hashed): paid by every request with a long system prompt.
func BenchmarkPrefixHash(b *testing.B) {
	s := strings.Repeat("You are a helpful assistant. ", 40)
	b.ReportAllocs()
	b.SetBytes(PrefixBytes)
	var h uint64
	for b.Loop() {
		h ^= PrefixHashOf(s)
	}
	_ = h
}

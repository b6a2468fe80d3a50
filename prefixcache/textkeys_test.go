package prefixcache

import (
	"strings"
	"testing"
)

// Two prompts share their keys for as many whole blocks as their texts
// agree, however the text was cut into writes; a difference changes
// every key from its block on.
func TestTextKeysFollowTheText(t *testing.T) {
	system := strings.Repeat("You are a careful assistant. ", 20) // 580 bytes
	turn1 := system + "user: what is a KV cache?"
	turn2 := turn1 + " assistant: the attention keys and values of the prompt. user: and a block?"
	keysOf := func(pieces ...string) []uint64 {
		var k TextKeys
		k.Reset(nil, RootSeed, 64)
		for _, p := range pieces {
			k.WriteString(p)
		}
		return append([]uint64(nil), k.Keys()...)
	}
	k1, k2 := keysOf(turn1), keysOf(turn2[:100], turn2[100:333], turn2[333:])
	if len(k1) != len(turn1)/64 || len(k2) != len(turn2)/64 {
		t.Fatalf("%d and %d keys for %d and %d bytes", len(k1), len(k2), len(turn1), len(turn2))
	}
	for i := range k1 {
		if k1[i] != k2[i] {
			t.Fatalf("block %d differs where the texts agree", i)
		}
	}
	other := keysOf(strings.Replace(turn2, "careful", "cheerful", 1)) // in block 0
	for i := range other {
		if other[i] == k2[i] {
			t.Fatalf("block %d equal after the texts differ in block 0", i)
		}
	}
	var b TextKeys
	b.Reset(nil, RootSeed, 64)
	b.Write([]byte(turn2))
	for i, k := range b.Keys() {
		if k != k2[i] {
			t.Fatalf("Write and WriteString disagree at block %d", i)
		}
	}
}

// BenchmarkTextKeys is an approximate index's cost for a 32,000-token
// prompt's text (128 KB): hashing only.
func BenchmarkTextKeys(b *testing.B) {
	text := strings.Repeat("the quick brown fox jumps over the lazy dog ", 2980) // ≈ 131 KB
	var k TextKeys
	dst := make([]uint64, 0, 4096)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		k.Reset(dst, RootSeed, 0)
		k.WriteString(text)
		dst = k.Keys()
	}
}

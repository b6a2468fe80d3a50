package proxy

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// validJSON is gjson.Valid, whatever the body.
func FuzzValidJSON(f *testing.F) {
	for _, s := range []string{
		`{"a":"b"}`, `{"a":"x` + "\x01" + `y\n"}`, `{"a":"\x"}`, "{\"a\":\"\xff\"}", `{"a":01}`, `{"a":-}`,
		`{"a":1.}`, `{"a":.5}`, `{"a":+1}`, `{"a":NaN}`, `{"a":1,}`, `{"a":1} x`, `{"a":"\ud800"}`,
		" {\"a\":1}\n", `{"a":1e400}`, `[1,2,]`, `{"a":"\u00zz"}`, `{a:1}`, `{"a":1}{"b":2}`, `"` + "\x03" + `\b"`,
		"{\"a\":\"tab\tin\\\"\"}", `[[[[]]]]`, `{"a":-0.5e-3}`, `true`, `nul`, ``, `"\/"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), gjson.ValidBytes(b); got != want {
			t.Fatalf("validJSON(%q) = %v, gjson says %v", b, got, want)
		}
	})
}

// hasControlByte finds a control byte at every offset of a word and in
// the tail, and never a byte of 0x20 or above.
func TestHasControlByte(t *testing.T) {
	for n := 1; n <= 19; n++ {
		clean := bytes.Repeat([]byte{0x20}, n)
		if hasControlByte(clean) {
			t.Fatalf("%d spaces: found a control byte", n)
		}
		for i := range n {
			for _, c := range []byte{0x00, 0x09, 0x1f} {
				b := bytes.Clone(clean)
				b[i] = c
				if !hasControlByte(b) {
					t.Fatalf("byte %#x at %d of %d: not found", c, i, n)
				}
			}
		}
	}
	high := []byte(strings.Repeat("\xff\x80\x9f\xa0é~ ", 5))
	if hasControlByte(high) {
		t.Fatal("bytes of 0x20 and above read as control bytes")
	}
}

func BenchmarkValidJSON(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum dolor sit amet, consectetur adipiscing elit ", 150) + `"}],"max_tokens":64}`)
	for _, v := range []struct {
		name  string
		valid func([]byte) bool
	}{{"validJSON", validJSON}, {"gjson", gjson.ValidBytes}} {
		b.Run(v.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if !v.valid(body) {
					b.Fatal("invalid")
				}
			}
		})
	}
}

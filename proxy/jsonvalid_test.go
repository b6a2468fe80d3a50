package proxy

import (
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/valyala/fastjson"
)

// validJSON is gjson.Valid, whatever the body, but for nesting deeper
// than maxJSONDepth.
func FuzzValidJSON(f *testing.F) {
	for _, s := range []string{
		`{"a":"b"}`, `{"a":"x` + "\x01" + `y\n"}`, `{"a":"\x"}`, "{\"a\":\"\xff\"}", `{"a":01}`, `{"a":-}`,
		`{"a":1.}`, `{"a":.5}`, `{"a":+1}`, `{"a":NaN}`, `{"a":1,}`, `{"a":1} x`, `{"a":"\ud800"}`,
		" {\"a\":1}\n", `{"a":1e400}`, `[1,2,]`, `{"a":"\u00zz"}`, `{a:1}`, `{"a":1}{"b":2}`, `"` + "\x03" + `\b"`,
		"{\"a\":\"tab\tin\\\"\"}", `[[[[]]]]`, `{"a":-0.5e-3}`, `true`, `nul`, ``, `"\/"`, "\"\x7f\"", `"\\\\\""`,
		`{"a":"` + strings.Repeat("[", 400) + `"}`, strings.Repeat("[", 301) + strings.Repeat("]", 301),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, want := validJSON(b), gjson.ValidBytes(b)
		if got == want || (want && naiveDepth(b) > maxJSONDepth) {
			return
		}
		t.Fatalf("validJSON(%q) = %v, gjson says %v", b, got, want)
	})
}

// naiveDepth is the nesting of a valid JSON text, read a byte at a time:
// jsonDepthOver's reference.
func naiveDepth(b []byte) int {
	depth, most, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			depth++
			most = max(most, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return most
}

// jsonDepthOver measures nesting as a byte-at-a-time reading does, and
// never counts a bracket inside a string.
func TestJSONDepthOver(t *testing.T) {
	for _, s := range []string{
		`{}`, `[[[]]]`, `{"a":[{"b":[1,{"c":{}}]}]}`, `{"a":"[[[[{{{{"}`, `["\"[[[", "\\", [["\\\"{{"]]]`,
		`[` + strings.Repeat(`"\\\\\"[",`, 20) + `[]]`, `{"x":"` + strings.Repeat(`\\`, 33) + `","y":[[[]]]}`,
	} {
		d := naiveDepth([]byte(s))
		for max := range d + 2 {
			if got, want := jsonDepthOver([]byte(s), max), d > max; got != want {
				t.Errorf("jsonDepthOver(%s, %d) = %v; the text nests %d deep", s, max, got, d)
			}
		}
	}
	if jsonDepthOver([]byte(`["`+strings.Repeat("[", 500)), 10) {
		t.Error("brackets in an unterminated string counted")
	}
}

// A client's 8 MiB of nesting is a 400 naming the depth. fastjson's
// validator, which read bodies before it, recursed once per level: at
// four million levels the goroutine's stack passed Go's 1 GB limit, a
// fatal error that ended the router.
func TestReadRequestDeepBody(t *testing.T) {
	const n = 4 << 20
	for _, body := range []string{
		strings.Repeat("[", n) + strings.Repeat("]", n),
		`{"model":"m","prompt":"x","metadata":` + strings.Repeat(`{"a":`, n/5) + `1` + strings.Repeat("}", n/5) + `}`,
	} {
		var p fastjson.Parser
		_, err := readRequest(&p, []byte(body), epCompletions)
		if err == nil || statusOf(err) != 400 || !strings.Contains(err.Error(), "nested more than 300 levels deep") {
			t.Fatalf("%d bytes of nesting: %v, want a 400 naming the depth", len(body), err)
		}
	}
	if err := checkJSON([]byte(strings.Repeat("[", n) + "]")); !errors.Is(err, errJSONDepth) {
		t.Fatalf("deep and malformed: %v, want errJSONDepth", err)
	}
}

func BenchmarkValidJSON(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum dolor sit amet, consectetur adipiscing elit ", 150) + `"}],"max_tokens":64}`)
	for _, v := range []struct {
		name  string
		valid func([]byte) bool
	}{
		{"validJSON", validJSON},
		{"fastjson", func(b []byte) bool { return fastjson.ValidateBytes(b) == nil }},
		{"gjson", gjson.ValidBytes},
	} {
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

package openai

import (
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/valyala/fastjson"
)

// ValidJSON is gjson.Valid, whatever the body, but for nesting deeper
// than MaxJSONDepth.
func FuzzValidJSON(f *testing.F) {
	for _, s := range []string{
		`{"a":"b"}`, `{"a":"x` + "\x01" + `y\n"}`, `{"a":"\x"}`, "{\"a\":\"\xff\"}", `{"a":01}`, `{"a":-}`,
		`{"a":1.}`, `{"a":.5}`, `{"a":+1}`, `{"a":NaN}`, `{"a":1,}`, `{"a":1} x`, `{"a":"\ud800"}`,
		" {\"a\":1}\n", `{"a":1e400}`, `[1,2,]`, `{"a":"\u00zz"}`, `{a:1}`, `{"a":1}{"b":2}`, `"` + "\x03" + `\b"`,
		"{\"a\":\"tab\tin\\\"\"}", `[[[[]]]]`, `{"a":-0.5e-3}`, `true`, `nul`, ``, `"\/"`, "\"\x7f\"", `"\\\\\""`,
		`{"a":"` + strings.Repeat("[", 400) + `"}`, strings.Repeat("[", 301) + strings.Repeat("]", 301),
		// Strings past a word, and dense with escapes (read byte by byte
		// after eight in a row), each with one fault late in it.
		`{"s":"` + strings.Repeat(`ab\ncd\"`, 12) + "\x1f" + `x"}`, `["` + strings.Repeat(`\t`, 9) + `\q"]`,
		`{"s":"` + strings.Repeat("lorem ipsum ", 12) + `\"` + strings.Repeat("dolor ", 9) + "\n" + `"}`,
		`{"s":"` + strings.Repeat(`x\\`, 20) + `\u12G4"}`, `["` + strings.Repeat("é", 20) + `\`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, want := ValidJSON(b), gjson.ValidBytes(b)
		if got == want || (want && naiveDepth(b) > MaxJSONDepth) {
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

// CheckJSON refuses a bracket past MaxJSONDepth, however the nesting is
// built, and never counts a bracket inside a string; at MaxJSONDepth the
// same texts pass.
func TestCheckJSONDepth(t *testing.T) {
	seen := map[bool]int{}
	for _, c := range []struct{ open, leaf, close string }{
		{"[", "[]", "]"},
		{`{"a":`, `{}`, "}"},
		{`[{"k":"[{","v":`, `["\\\"[[",[]]`, "}]"}, // two levels a step
		{`{"s":"]]}}","a":[`, `[1,2.5e-3,true,null]`, "]}"},
	} {
		for reps := 1; reps <= MaxJSONDepth+2; reps++ {
			b := []byte(strings.Repeat(c.open, reps) + c.leaf + strings.Repeat(c.close, reps))
			depth := naiveDepth(b)
			if depth < MaxJSONDepth-1 || depth > MaxJSONDepth+2 {
				continue
			}
			if !gjson.ValidBytes(b) {
				t.Fatalf("%.40s…: not JSON", b)
			}
			err := CheckJSON(b)
			seen[depth > MaxJSONDepth]++
			switch {
			case depth > MaxJSONDepth && !errors.Is(err, ErrJSONDepth):
				t.Errorf("%.40s… nests %d deep: %v, want errJSONDepth", b, depth, err)
			case depth <= MaxJSONDepth && err != nil:
				t.Errorf("%.40s… nests %d deep: %v, want nil", b, depth, err)
			}
		}
	}
	if seen[true] < 4 || seen[false] < 4 {
		t.Fatalf("texts over and within the depth: %v, want each nesting tried on both sides", seen)
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
		_, err := ReadRequest(&p, []byte(body), Completions)
		if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "nested more than 300 levels deep") {
			t.Fatalf("%d bytes of nesting: %v, want a bad request naming the depth", len(body), err)
		}
	}
	if err := CheckJSON([]byte(strings.Repeat("[", n) + "]")); !errors.Is(err, ErrJSONDepth) {
		t.Fatalf("deep and malformed: %v, want errJSONDepth", err)
	}
}

// BenchmarkValidJSON checks an 8 KB prompt of prose and one of code, and
// a request and an answer of `gpurouter bench proxy-cost`'s sizes (300
// and 500 bytes), which every non-streamed request has checked.
func BenchmarkValidJSON(b *testing.B) {
	long := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum dolor sit amet, consectetur adipiscing elit ", 150) + `"}],"max_tokens":64}`)
	for _, body := range []struct {
		name string
		b    []byte
	}{
		{"8KB", long},
		// Source code: an escape every few bytes, quotes among them.
		{"8KB-escaped", []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat(`\tif x := f(\"a\\\\b\"); x {\n`, 256) + `"}]}`)},
		{"request", sized(`{"model":"m","messages":[{"role":"user","content":"`, 300, `"}],"max_tokens":64,"temperature":0}`)},
		{"answer", sized(`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"`,
			500, `"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":60,"total_tokens":124,"completion_tokens":64}}`)},
	} {
		for _, v := range []struct {
			name  string
			valid func([]byte) bool
		}{
			{"validJSON", ValidJSON},
			{"fastjson", func(b []byte) bool { return fastjson.ValidateBytes(b) == nil }},
			{"gjson", gjson.ValidBytes},
		} {
			b.Run(body.name+"/"+v.name, func(b *testing.B) {
				b.SetBytes(int64(len(body.b)))
				b.ReportAllocs()
				for b.Loop() {
					if !v.valid(body.b) {
						b.Fatal("invalid")
					}
				}
			})
		}
	}
}

// sized is head, words, tail: n bytes of JSON text.
func sized(head string, n int, tail string) []byte {
	words := strings.Repeat("lorem ipsum dolor sit amet ", n/27+1)
	return []byte(head + words[:n-len(head)-len(tail)] + tail)
}

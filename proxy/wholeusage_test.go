package proxy

import (
	"strings"
	"testing"

	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fastjson"
)

// wholeUsage reads what openai.ReadUsage (gjson's walk) reads from a whole
// response that is JSON: the top-level usage only, counts read as gjson
// reads them. From a body that is not JSON — only an error's is relayed
// unchecked — it reads none, where gjson reads what it can.
func TestWholeUsageIsReadUsage(t *testing.T) {
	s := &Server{}
	for _, body := range []string{
		`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":60,"total_tokens":124,"completion_tokens":64},"prompt_logprobs":null}`,
		`{"usage":{"prompt_tokens":7}}`,
		`{"usage":{"prompt_tokens":"12","completion_tokens":3.9}}`,
		`{"choices":[{"usage":{"prompt_tokens":1,"completion_tokens":1}}],"usage":{"prompt_tokens":2,"completion_tokens":2}}`,
		`{"choices":[{"usage":{"prompt_tokens":1,"completion_tokens":1}}]}`,
		`{"usage":null}`, `{"usage":[1]}`, `{"usage": {"completion_tokens":true}}`, `[{"usage":{}}]`,
		`{"error":{"message":"no \"usage\": here"}}`, ``,
	} {
		p, c, ok := s.wholeUsage([]byte(body))
		wp, wc, wok := openai.ReadUsage([]byte(body))
		if p != wp || c != wc || ok != wok {
			t.Errorf("%s: wholeUsage %d, %d, %v; readUsage %d, %d, %v", body, p, c, ok, wp, wc, wok)
		}
	}
	// A 200's usage is found where its check noted it (respondWhole), as
	// a parse of the whole answer finds it, spaces around the colon too
	// (the scan looks for "usage": as engines write it). Past openai.MaxMembers,
	// or after a key with escapes, the check can't tell: the scan reads it.
	for _, tc := range []struct {
		body  string
		known bool
	}{
		{`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":60,"total_tokens":124,"completion_tokens":64},"prompt_logprobs":null}`, true},
		{` {"usage" : {"prompt_tokens":3,"completion_tokens":4}} `, true},
		{`{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}`, true},
		{`{"usage":[1]}`, true}, {`{"a":1}`, true}, {`[{"usage":{"prompt_tokens":1}}]`, true},
		{`{"r\u006fle":1,"usage":{"prompt_tokens":2}}`, false},
		{`{` + strings.Repeat(`"k":0,`, openai.MaxMembers) + `"usage":{"prompt_tokens":8,"completion_tokens":1}}`, false},
	} {
		var m openai.ObjectMembers
		if err := openai.CheckJSONMembers([]byte(tc.body), &m); err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		b := &wholeBody{buf: &bytebufferpool.ByteBuffer{B: []byte(tc.body)}}
		b.setUsage(m.Member(b.buf.B, "usage"))
		if b.known != tc.known {
			t.Fatalf("%.60s: known %v, want %v", tc.body, b.known, tc.known)
		}
		p, c, ok := b.tokens(s)
		var wp, wc int
		var wok bool
		if u := fastjson.MustParse(tc.body).Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
			wp, wc, wok = int(openai.IntOf(u.Get("prompt_tokens"))), int(openai.IntOf(u.Get("completion_tokens"))), true
		}
		if p != wp || c != wc || ok != wok {
			t.Errorf("%.60s: usage %d, %d, %v; the parse's %d, %d, %v", tc.body, p, c, ok, wp, wc, wok)
		}
	}
	if p, c, ok := s.wholeUsage([]byte(`{"usage":{"prompt_tokens":5}`)); ok {
		t.Errorf("truncated body: usage %d, %d", p, c)
	}
}

// A 4 KB reply's usage, against gjson's walk to it (openai.ReadUsage).
func BenchmarkWholeUsage(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("lorem ipsum dolor sit amet, consectetur adipiscing elit ", 70) +
		`"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":60,"total_tokens":124,"completion_tokens":64},"prompt_logprobs":null}`)
	s := &Server{}
	for _, v := range []struct {
		name string
		read func([]byte) (int, int, bool)
	}{{"wholeUsage", s.wholeUsage}, {"readUsage", openai.ReadUsage}} {
		b.Run(v.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, c, ok := v.read(body); !ok || c != 64 {
					b.Fatal("no usage")
				}
			}
		})
	}
}

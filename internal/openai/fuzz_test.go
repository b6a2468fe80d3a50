package openai

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tidwall/gjson"
)

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","prompt":["a","b"],"max_tokens":16,"stream":true,"stream_options":{"include_usage":false}}`,
		`{"model":"m","prompt":[1,2,3],"user":"u"}`,
		`{"model":"m","input":"embed me"}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":5}`,
		`{"stream_options":null,"stream":true,"messages":[{"role":"system","content":null}]}`,
		`{"model":"m","max_tokens":-1}`, `[]`, `{`, ``, `{"model":"\u00e9\"x"}`,
	} {
		for ep := uint8(1); ep <= 3; ep++ {
			f.Add([]byte(s), ep)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, epn uint8) {
		ep := Endpoint(epn%3 + 1)
		orig := append([]byte(nil), body...)
		r, err := parseRequest(body, ep)
		if !bytes.Equal(body, orig) {
			t.Fatal("parseRequest modified the body")
		}
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("parse error is not a bad request (400): %v", err)
			}
			return
		}
		if r.PromptBytes < 0 || r.MaxTokens < 0 {
			t.Fatalf("negative sizes: %+v", r)
		}
		if ep != Embeddings {
			checkMaxTokensClamp(t, body, ep, r)
		}
		if r.Stream && !r.ClientUsage {
			out, err := WithIncludeUsage(body, &r)
			if err != nil {
				return // sjson refuses some valid-but-odd documents; the handler answers 400
			}
			if !gjson.ValidBytes(out) || !gjson.GetBytes(out, "stream_options.include_usage").Bool() {
				t.Fatalf("rewrite lost include_usage or broke JSON: %s", out)
			}
			r2, err := parseRequest(out, ep)
			if err != nil || r2.Model != r.Model || r2.Stream != r.Stream || r2.MaxTokens != r.MaxTokens || !r2.ClientUsage {
				t.Fatalf("rewritten body parses differently: %+v vs %+v (%v)", r2, r, err)
			}
		}
	})
}

// checkMaxTokensClamp checks a pool's max_tokens cap on a body that
// parsed: the rewrite is valid JSON that parses the same, and the engine —
// reading the last of each key — can't generate more than the cap (an
// explicit 0 stays: the engine refuses it).
func checkMaxTokensClamp(t *testing.T, body []byte, ep Endpoint, r Request) {
	const limit = 16
	clamped := r
	out, _, err := clamped.ClampOutput(append([]byte(nil), body...), limit)
	if err != nil {
		return // refused with 400 (sjson refusing an odd document)
	}
	r2, err := parseRequest(out, ep)
	if err != nil || r2.Model != r.Model || r2.Stream != r.Stream || r2.MaxTokens > limit {
		t.Fatalf("clamped body parses as %+v (%v), was %+v: %s", r2, err, r, out)
	}
	if r2.MaxTokens != 0 && r2.MaxTokens != clamped.MaxTokens {
		t.Fatalf("the router costs %d output tokens, the engine would read %d: %s", clamped.MaxTokens, r2.MaxTokens, out)
	}
	last := map[string]gjson.Result{}
	gjson.ParseBytes(out).ForEach(func(k, v gjson.Result) bool { last[k.Str] = v; return true })
	mt, mct := last["max_tokens"], last["max_completion_tokens"]
	if mt.Type != gjson.Number && mct.Type != gjson.Number {
		t.Fatalf("clamped body names no max_tokens: %s", out)
	}
	for _, v := range []gjson.Result{mt, mct} {
		if v.Exists() && (v.Type != gjson.Number || v.Int() > limit) {
			t.Fatalf("the engine would read %s from the clamped body: %s", v.Raw, out)
		}
	}
}

package proxy

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		chatStream, chatPlain,
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
		ep := endpoint(epn%3 + 1)
		orig := append([]byte(nil), body...)
		r, err := parseRequest(body, ep)
		if !bytes.Equal(body, orig) {
			t.Fatal("parseRequest modified the body")
		}
		if err != nil {
			if statusOf(err) != 400 {
				t.Fatalf("parse error maps to %d, want 400: %v", statusOf(err), err)
			}
			return
		}
		if r.promptBytes < 0 || r.maxTokens < 0 {
			t.Fatalf("negative sizes: %+v", r)
		}
		if ep != epEmbeddings {
			checkMaxTokensClamp(t, body, ep, r)
		}
		if r.stream && !r.clientUsage {
			out, err := withIncludeUsage(body, &r)
			if err != nil {
				return // sjson refuses some valid-but-odd documents; the handler answers 400
			}
			if !gjson.ValidBytes(out) || !gjson.GetBytes(out, "stream_options.include_usage").Bool() {
				t.Fatalf("rewrite lost include_usage or broke JSON: %s", out)
			}
			r2, err := parseRequest(out, ep)
			if err != nil || r2.model != r.model || r2.stream != r.stream || r2.maxTokens != r.maxTokens || !r2.clientUsage {
				t.Fatalf("rewritten body parses differently: %+v vs %+v (%v)", r2, r, err)
			}
		}
	})
}

// checkMaxTokensClamp checks a pool's max_tokens cap on a body that
// parsed: the rewrite is valid JSON that parses the same, and the engine —
// reading the last of each key — can't generate more than the cap (an
// explicit 0 stays: the engine refuses it).
func checkMaxTokensClamp(t *testing.T, body []byte, ep endpoint, r request) {
	const limit = 16
	clamped := r
	out, _, err := clamped.clampOutput(append([]byte(nil), body...), limit)
	if err != nil {
		return // refused with 400 (sjson refusing an odd document)
	}
	r2, err := parseRequest(out, ep)
	if err != nil || r2.model != r.model || r2.stream != r.stream || r2.maxTokens > limit {
		t.Fatalf("clamped body parses as %+v (%v), was %+v: %s", r2, err, r, out)
	}
	if r2.maxTokens != 0 && r2.maxTokens != clamped.maxTokens {
		t.Fatalf("the router costs %d output tokens, the engine would read %d: %s", clamped.maxTokens, r2.maxTokens, out)
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

// chunkedBody feeds data to the relay in pieces of the given sizes, then
// EOF, like a network stream would.
type chunkedBody struct {
	data  []byte
	sizes []byte
	i     int
}

func (c *chunkedBody) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := len(c.data)
	if len(c.sizes) > 0 {
		n = int(c.sizes[c.i%len(c.sizes)]) + 1
		c.i++
	}
	n = min(n, len(p), len(c.data))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func (c *chunkedBody) CloseWithError(error) error { return nil }

func FuzzSSERelay(f *testing.F) {
	chunk := "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
	usage := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n"
	f.Add([]byte(chunk+chunk+usage+"data: [DONE]\n\n"), []byte{3, 7}, true)
	f.Add([]byte(chunk+chunk), []byte{}, false)
	f.Add([]byte("data: {\"error\":{\"message\":\"boom\"}}\n\ndata: [DONE]\n\n"), []byte{1}, false)
	f.Add([]byte(": keep-alive\r\n\r\ndata: [DONE]\r\n\r\ndata: after\n\n"), []byte{0}, true)
	f.Fuzz(func(t *testing.T, data, sizes []byte, strip bool) {
		s := &Server{cfg: Config{}.withDefaults(), now: time.Now}
		x := &exchange{s: s, received: time.Now()}
		buf := make([]byte, 0, 64)
		r := &relay{x: x, body: &chunkedBody{data: data, sizes: sizes}, strip: strip, buf: buf, in: buf[:0]}
		out, err := io.ReadAll(io.LimitReader(r, int64(len(data))+1<<16))
		if err != nil {
			t.Fatal(err)
		}
		var dones, events int
		var last []byte
		for rest := out; len(rest) > 0; {
			k := nextEvent(rest)
			if k < 0 {
				t.Fatalf("relay output ends mid-event: %q", rest)
			}
			last = eventData(rest[:k])
			if bytes.Equal(last, donePayload) {
				dones++
			}
			events++
			rest = rest[k:]
		}
		if dones != 1 || !bytes.Equal(last, donePayload) {
			t.Fatalf("relay output must end with exactly one [DONE] (%d in %d events): %q", dones, events, out)
		}
		if !r.sawDone && r.failure == nil {
			t.Fatal("stream without [DONE] not marked as failed")
		}
		if r.sawDone && r.failure == nil && len(out) > len(data) {
			t.Fatalf("clean relay grew the stream: %d > %d", len(out), len(data))
		}
		if x.itlCount != max(x.tokenChunks-1, 0) {
			t.Fatalf("itl gaps %d for %d token chunks", x.itlCount, x.tokenChunks)
		}
	})
}

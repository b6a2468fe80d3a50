package openai

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// WithIncludeUsage asks for the usage chunk in every shape of body: no
// stream_options (added as the first member), stream_options null
// (replaced), an object (include_usage set within); the result is valid
// JSON with one stream_options and the body's other members unchanged.
func TestWithIncludeUsage(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","stream":true,"messages":[]}`,
		`  {"stream":true}`,
		`{"stream":true}` + "\n",
		"{\n\t\"stream\" : true\n}",
		`{"stream":true,"stream_options":null}`,
		`{"stream_options":null,"stream":true}`,
		`{"stream":true,"stream_options":{}}`,
		`{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":false}}`,
	} {
		r, err := parseRequest([]byte(body), Completions)
		if err != nil && !strings.Contains(err.Error(), "prompt") {
			t.Fatalf("%s: %v", body, err)
		}
		out, err := WithIncludeUsage([]byte(body), &r)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		var got, in map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s became invalid JSON %s: %v", body, out, err)
		}
		if n := strings.Count(string(out), `"stream_options"`); n != 1 {
			t.Errorf("%s became %s: stream_options %d times", body, out, n)
		}
		if so, _ := got["stream_options"].(map[string]any); so["include_usage"] != true {
			t.Errorf("%s became %s: no include_usage", body, out)
		}
		json.Unmarshal([]byte(body), &in) //nolint:errcheck // valid: parsed above
		for k, v := range in {
			if k != "stream_options" && !reflect.DeepEqual(got[k], v) {
				t.Errorf("%s became %s: %s changed", body, out, k)
			}
		}
	}
}

// BenchmarkIncludeUsage is the rewrite of a streamed chat request with an
// 8 KB prompt and no stream_options: one copy.
func BenchmarkIncludeUsage(b *testing.B) {
	body := []byte(`{"model":"m","stream":true,"max_tokens":128,"messages":[{"role":"user","content":"` + strings.Repeat("The quick brown fox jumps over the lazy dog, again and again. ", 130) + `"}]}`)
	r, err := parseRequest(body, Chat)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := WithIncludeUsage(body, &r); err != nil {
			b.Fatal(err)
		}
	}
}

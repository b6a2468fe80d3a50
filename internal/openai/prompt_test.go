package openai

import (
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

// record is a PromptSink writing what it gets as text.
type record struct{ strings.Builder }

func (r *record) Turn(role []byte) { r.WriteString("[" + string(role) + "]") }
func (r *record) Text(t []byte)    { r.Write(t) }

// The prompt's text reaches the sink during the one parse: chat messages
// in order, role then content (text parts joined, escapes decoded); a
// completion's one prompt string; nothing for token ids.
func TestReadRequestToSink(t *testing.T) {
	for _, tc := range []struct {
		name string
		ep   Endpoint
		body string
		want string
	}{
		{"chat", Chat, `{"messages":[{"role":"system","content":"be \"brief\""},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]},{"role":"assistant","content":null}]}`,
			`[system]be "brief"[user]ab[assistant]`},
		{"completion", Completions, `{"prompt":"once upon"}`, "once upon"},
		{"completion of one", Completions, `{"prompt":["once"]}`, "once"},
		{"several prompts", Completions, `{"prompt":["a","b"]}`, ""},
		{"token ids", Completions, `{"prompt":[1,2,3]}`, ""},
		{"embeddings", Embeddings, `{"input":"x"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p fastjson.Parser
			var rec record
			if _, err := ReadRequestTo(&p, []byte(tc.body), tc.ep, &rec); err != nil {
				t.Fatal(err)
			}
			if rec.String() != tc.want {
				t.Fatalf("sink got %q, want %q", rec.String(), tc.want)
			}
		})
	}
}

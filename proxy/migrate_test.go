package proxy

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestWithTokenIDs(t *testing.T) {
	for in, want := range map[string]string{
		`{"model":"m"}`:  `{"return_token_ids":true,"model":"m"}`,
		` {"model":"m"}`: ` {"return_token_ids":true,"model":"m"}`,
		`{}`:             `{"return_token_ids":true}`,
		`{ }`:            `{"return_token_ids":true }`,
	} {
		got, ok := withTokenIDs(nil, []byte(in))
		if !ok || string(got) != want || !json.Valid(got) {
			t.Errorf("%s: %s %v, want %s", in, got, ok, want)
		}
	}
	if _, ok := withTokenIDs(nil, []byte(`[1]`)); ok {
		t.Error("an array got token ids")
	}
}

// vLLM 0.10.2+'s chat stream with return_token_ids, as pydantic writes it.
var vllmChat = []string{
	`data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":17,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3]}` + "\n\n",
	`data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":17,"model":"m","choices":[{"index":0,"delta":{"content":" He said \"hi\""},"logprobs":null,"finish_reason":null,"token_ids":[40,41,42]}]}` + "\n\n",
	`data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":17,"model":"m","choices":[{"index":0,"delta":{"content":"."},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[43]}]}` + "\n\n",
}

func TestTrackKeepsTextAndIDsAndHidesThem(t *testing.T) {
	m := &migration{pol: Migration{Max: 1, MaxSeqLen: 100}, chat: true, strip: true, idsOK: true, buf: &migBuffers{}}
	var out []byte
	for _, ev := range vllmChat {
		var keep bool
		if out, keep = m.token(out, []byte(ev)); !keep {
			t.Fatalf("dropped %s", ev)
		}
	}
	if s := string(out); strings.Contains(s, "token_ids") {
		t.Errorf("ids reached the client: %s", s)
	}
	for _, ev := range strings.Split(strings.TrimSpace(string(out)), "\n\n") {
		if !json.Valid([]byte(strings.TrimPrefix(ev, "data: "))) {
			t.Errorf("invalid JSON after stripping: %s", ev)
		}
	}
	b := m.buf
	if string(b.text) != ` He said \"hi\".` || string(b.ids) != "40,41,42,43" || string(b.promptIDs) != "1,2,3" ||
		m.tokens != 4 || m.promptN != 3 || !m.idsOK || !m.finished || string(b.id) != `"chatcmpl-7"` || string(b.created) != "17" {
		t.Errorf("text %q ids %q prompt %q tokens %d/%d idsOK %v finished %v id %s created %s",
			b.text, b.ids, b.promptIDs, m.tokens, m.promptN, m.idsOK, m.finished, b.id, b.created)
	}
	if m.off != nil {
		t.Errorf("stopped: %v", m.off)
	}

	// A continuation: its role chunk is not the client's, its id and
	// time become the first replica's.
	m.cont, m.before = true, m.tokens
	if _, keep := m.token(nil, []byte(strings.ReplaceAll(vllmChat[0], "chatcmpl-7", "chatcmpl-9"))); keep {
		t.Error("a continuation's role chunk reached the client")
	}
	ev := strings.ReplaceAll(strings.ReplaceAll(vllmChat[1], "chatcmpl-7", "chatcmpl-9"), `"created":17`, `"created":99`)
	got, _ := m.token(nil, []byte(ev))
	if want := strings.ReplaceAll(vllmChat[1], `,"token_ids":[40,41,42]`, ""); string(got) != want {
		t.Errorf("continuation chunk\n%s\nwant\n%s", got, want)
	}

	// Its usage: the first prompt, both replicas' output.
	x := &exchange{}
	usage := `data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":99,"model":"m","choices":[],"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3,"prompt_tokens_details":null}}` + "\n\n"
	got = m.fixUsage(nil, []byte(usage), x)
	want := `data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":17,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":10,"completion_tokens":7}}` + "\n\n"
	if string(got) != want || x.promptTokens != 3 || x.completionTokens != 7 {
		t.Errorf("usage\n%s\nwant\n%s (exchange %d/%d)", got, want, x.promptTokens, x.completionTokens)
	}
}

func TestTrackStopsAtWhatCannotBeContinued(t *testing.T) {
	for name, ev := range map[string]string{
		"tool call": `data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t","function":{"name":"f"}}]},"finish_reason":null}]}`,
		"reasoning": `data: {"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}`,
		"too long":  `data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null,"token_ids":[1,2,3,4,5,6,7,8,9,10,11]}]}`,
	} {
		m := &migration{pol: Migration{Max: 1, MaxSeqLen: 10}, chat: true, idsOK: true, buf: &migBuffers{}}
		m.token(nil, []byte(ev+"\n\n"))
		if m.off == nil {
			t.Errorf("%s: still continuable", name)
		}
	}
	// Text without ids: one chunk counts as one token.
	m := &migration{pol: Migration{Max: 1, MaxSeqLen: 10}, idsOK: true, buf: &migBuffers{}}
	m.token(nil, []byte(`data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":" a b","finish_reason":null}]}`+"\n\n"))
	if m.idsOK || m.tokens != 1 || string(m.buf.text) != " a b" {
		t.Errorf("idsOK %v tokens %d text %q", m.idsOK, m.tokens, m.buf.text)
	}
}

func TestContinuationBody(t *testing.T) {
	chat := `{"model":"m","stream":true,"max_tokens":10,"min_tokens":3,"temperature":0.7,"stop":["\n\n"],"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name   string
		body   string
		chat   bool
		text   string
		ids    string
		prompt string // prompt ids
		tokens int
		check  map[string]string // gjson path → raw value
		err    error
	}{
		{name: "chat", body: chat, chat: true, text: ` Hello \"you\"`, tokens: 3, check: map[string]string{
			"messages.1":             `{"role":"assistant","content":" Hello \"you\""}`,
			"continue_final_message": "true", "add_generation_prompt": "false",
			"max_tokens": "7", "min_tokens": "0", "temperature": "0.7", "stop": `["\n\n"]`,
		}},
		{name: "chat, the client's prefill grows", chat: true, text: " there", tokens: 1,
			body:  `{"max_completion_tokens":5,"continue_final_message":true,"add_generation_prompt":false,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Well,"}]}`,
			check: map[string]string{"messages.1.content": `"Well, there"`, "messages.#": "2", "max_completion_tokens": "4"}},
		{name: "completions, text", body: `{"prompt":"Once","max_tokens":4}`, text: " upon", tokens: 1,
			check: map[string]string{"prompt": `"Once upon"`, "max_tokens": "3"}},
		{name: "completions, one prompt in a list", body: `{"prompt":["Once"]}`, text: " upon", tokens: 1,
			check: map[string]string{"prompt": `["Once upon"]`}},
		{name: "completions, token ids", body: `{"prompt":"Once","max_tokens":4}`, text: " upon a", ids: "7,8", prompt: "1,2", tokens: 2,
			check: map[string]string{"prompt": `[1,2,7,8]`, "max_tokens": "2"}},
		{name: "completions, token-id prompt without ids back", body: `{"prompt":[1,2]}`, text: " upon", tokens: 1, err: errNoIDs},
		{name: "nothing generated yet", body: chat, chat: true, check: map[string]string{"messages.#": "1", "max_tokens": "10"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &migration{body: []byte(tc.body), chat: tc.chat, tokens: tc.tokens, idsOK: tc.ids != "",
				prefill: strings.Contains(tc.body, `"continue_final_message":true`),
				buf:     &migBuffers{text: []byte(tc.text), ids: []byte(tc.ids), promptIDs: []byte(tc.prompt)}}
			if tc.prompt != "" {
				m.promptN = strings.Count(tc.prompt, ",") + 1
			}
			got, err := m.continuation()
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("error %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || !json.Valid(got) {
				t.Fatalf("%s: %v", got, err)
			}
			for path, want := range tc.check {
				if raw := gjson.GetBytes(got, path).Raw; raw != want {
					t.Errorf("%s = %s, want %s\n%s", path, raw, want, got)
				}
			}
		})
	}
}

// FuzzMigrationTrack: whatever an engine streams, tracking never panics,
// and a valid chunk stays valid JSON once the router's token ids are gone.
func FuzzMigrationTrack(f *testing.F) {
	for _, ev := range vllmChat {
		f.Add(strings.TrimPrefix(strings.TrimSpace(ev), "data: "), true)
	}
	f.Add(`{"choices":[{"text":"a\\","token_ids":[1,]}],"prompt_token_ids":null}`, false)
	f.Add(`{"token_ids":[1],"id":"x","created":"y","choices":[{"delta":{"content":"\"}"}}]}`, true)
	f.Fuzz(func(t *testing.T, payload string, chat bool) {
		m := &migration{pol: Migration{Max: 1, MaxSeqLen: 1 << 20}, chat: chat, strip: true, idsOK: true, cont: len(payload)%2 == 0,
			buf: &migBuffers{id: []byte(`"i"`), created: []byte("1")}}
		ev := []byte("data: " + payload + "\n\n")
		out, keep := m.token(nil, ev)
		if !keep || !json.Valid([]byte(payload)) {
			return
		}
		if got := strings.TrimSuffix(strings.TrimPrefix(string(out), "data: "), "\n\n"); !json.Valid([]byte(got)) {
			t.Errorf("valid chunk\n%s\nbecame\n%s", payload, got)
		}
		x := &exchange{}
		m.fixUsage(nil, ev, x)
	})
}

// An engine that sends output without token ids is not searched for them
// again, but a continuation on an engine that returns them (a fleet
// mid-upgrade) still has them taken out of what the client sees.
func TestTrackIDsFromAContinuationOnly(t *testing.T) {
	m := &migration{pol: Migration{Max: 1, MaxSeqLen: 100}, chat: true, strip: true, idsOK: true, buf: &migBuffers{}}
	noIDs := func(ev string) string {
		return strings.NewReplacer(`,"token_ids":[40,41,42]`, "", `,"token_ids":[43]`, "", `,"prompt_token_ids":[1,2,3]`, "").Replace(ev)
	}
	for _, ev := range vllmChat[:2] {
		m.token(nil, []byte(noIDs(ev)))
	}
	if m.idsOK || m.idsSeen || m.tokens != 1 || string(m.buf.text) != ` He said \"hi\"` {
		t.Fatalf("after output without ids: idsOK %v idsSeen %v tokens %d text %q", m.idsOK, m.idsSeen, m.tokens, m.buf.text)
	}
	m.cont, m.contFirst, m.before = true, true, m.tokens
	got, keep := m.token(nil, []byte(vllmChat[2]))
	if want := strings.ReplaceAll(vllmChat[2], `,"token_ids":[43]`, ""); !keep || string(got) != want {
		t.Fatalf("continuation chunk\n%s\nwant\n%s", got, want)
	}
	m.contFirst = false // as relay.tracked does after the continuation's first chunk
	if got, _ := m.token(nil, []byte(vllmChat[1])); strings.Contains(string(got), "token_ids") {
		t.Fatalf("the continuation's ids reached the client: %s", got)
	}
}

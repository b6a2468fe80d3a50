package openai

import "testing"

// What a continuation of a stream on another replica needs, or forbids,
// read from the request (migrate.go in proxy continues it).
func TestParseRecordsWhatAContinuationNeeds(t *testing.T) {
	for _, tc := range []struct {
		name string
		ep   Endpoint
		body string
		want ContFlags
	}{
		{"plain chat", Chat, `{"messages":[{"role":"user","content":"hi"}],"n":1,"logprobs":false,"top_logprobs":0}`, 0},
		{"n=2", Chat, `{"messages":[{"role":"user","content":"hi"}],"n":2}`, ContNo},
		{"logprobs", Chat, `{"messages":[{"role":"user","content":"hi"}],"logprobs":true}`, ContNo},
		{"completion logprobs", Completions, `{"prompt":"hi","logprobs":1}`, ContNo},
		{"json schema", Chat, `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema"}}`, ContNo},
		{"text format", Chat, `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"text"}}`, 0},
		{"guided", Chat, `{"messages":[{"role":"user","content":"hi"}],"guided_regex":"a+"}`, ContNo},
		{"echo", Completions, `{"prompt":"hi","echo":true}`, ContNo},
		{"per-chunk usage", Chat, `{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, ContNo},
		{"two prompts", Completions, `{"prompt":["a","b"]}`, ContNo},
		{"one prompt in a list", Completions, `{"prompt":["a"]}`, 0},
		{"token ids", Completions, `{"prompt":[1,2,3]}`, ContPromptIDs},
		{"one list of token ids", Completions, `{"prompt":[[1,2,3]]}`, ContPromptIDs},
		{"two lists of token ids", Completions, `{"prompt":[[1],[2]]}`, ContNo},
		{"client token ids", Chat, `{"messages":[{"role":"user","content":"hi"}],"return_token_ids":true}`, ContClientIDs},
		{"client prefill", Chat, `{"messages":[{"role":"assistant","content":"Sure"}],"continue_final_message":true,"add_generation_prompt":false}`, ContFinal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseRequest([]byte(tc.body), tc.ep)
			if err != nil {
				t.Fatal(err)
			}
			if r.Cont != tc.want {
				t.Errorf("flags %b, want %b", r.Cont, tc.want)
			}
		})
	}
}

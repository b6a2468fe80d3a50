package openai

import "testing"

// What counts as a stream's output: the router's TTFT and inter-token
// gaps are its chunks with some, as vLLM's benchmark counts them.
func TestClassifyEventOutput(t *testing.T) {
	for _, c := range []struct {
		name, payload string
		want          EventKind
	}{
		{"chat content", `{"id":"c","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`, EventToken},
		{"chat role only", `{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`, EventChoice},
		{"chat role, no content member", `{"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}`, EventChoice},
		{"chat role and content together", `{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}`, EventToken},
		{"chat finish only", `{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, EventChoice},
		{"chat spaced", `{"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}`, EventToken},
		{"tool call", `{"id":"c","choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}`, EventToken},
		{"no tool call", `{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[]}}]}`, EventChoice},
		{"reasoning_content", `{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"Let me"}}]}`, EventToken},
		{"reasoning", `{"id":"c","choices":[{"index":0,"delta":{"reasoning":"Let me"}}]}`, EventToken},
		{"empty content, logprobs content", `{"id":"c","choices":[{"index":0,"delta":{"content":""},"logprobs":{"content":[{"token":"a"}]}}]}`, EventChoice},
		{"completion text", `{"id":"cmpl","choices":[{"index":0,"text":" world","finish_reason":null}]}`, EventToken},
		{"completion empty text", `{"id":"cmpl","choices":[{"index":0,"text":"","finish_reason":"length"}]}`, EventChoice},
		{"key in a string", `{"id":"c","choices":[{"index":0,"delta":{"role":"a\"content\":\"x"}}]}`, EventChoice},
		{"usage only", `{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`, EventUsageOnly},
	} {
		t.Run(c.name, func(t *testing.T) {
			var h ChunkHints
			if got := ClassifyEvent([]byte(c.payload), &h); got != c.want {
				t.Errorf("classifyEvent = %d, want %d", got, c.want)
			}
			if got := ClassifyEvent([]byte(c.payload), nil); got != c.want {
				t.Errorf("without hints: %d, want %d", got, c.want)
			}
		})
	}
	// The hint follows the stream, and a chunk without output where the
	// last one had it is still seen as one without.
	var h ChunkHints
	content := []byte(`{"id":"c","choices":[{"index":0,"delta":{"content":"Hi"}}]}`)
	empty := []byte(`{"id":"c","choices":[{"index":0,"delta":{"content":""}}]}`)
	for i, want := range []EventKind{EventToken, EventToken, EventChoice, EventToken} {
		p := content
		if want == EventChoice {
			p = empty
		}
		if got := ClassifyEvent(p, &h); got != want {
			t.Errorf("chunk %d: %d, want %d", i, got, want)
		}
	}
}

package proxy

import (
	"io"
	"testing"
	"time"
)

// What counts as a stream's output: the router's TTFT and inter-token
// gaps are its chunks with some, as vLLM's benchmark counts them.
func TestClassifyEventOutput(t *testing.T) {
	for _, c := range []struct {
		name, payload string
		want          eventKind
	}{
		{"chat content", `{"id":"c","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`, evToken},
		{"chat role only", `{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`, evChoice},
		{"chat role, no content member", `{"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}`, evChoice},
		{"chat role and content together", `{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}`, evToken},
		{"chat finish only", `{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, evChoice},
		{"chat spaced", `{"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}`, evToken},
		{"tool call", `{"id":"c","choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}`, evToken},
		{"no tool call", `{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[]}}]}`, evChoice},
		{"reasoning_content", `{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"Let me"}}]}`, evToken},
		{"reasoning", `{"id":"c","choices":[{"index":0,"delta":{"reasoning":"Let me"}}]}`, evToken},
		{"empty content, logprobs content", `{"id":"c","choices":[{"index":0,"delta":{"content":""},"logprobs":{"content":[{"token":"a"}]}}]}`, evChoice},
		{"completion text", `{"id":"cmpl","choices":[{"index":0,"text":" world","finish_reason":null}]}`, evToken},
		{"completion empty text", `{"id":"cmpl","choices":[{"index":0,"text":"","finish_reason":"length"}]}`, evChoice},
		{"key in a string", `{"id":"c","choices":[{"index":0,"delta":{"role":"a\"content\":\"x"}}]}`, evChoice},
		{"usage only", `{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`, evUsageOnly},
	} {
		t.Run(c.name, func(t *testing.T) {
			var h chunkHints
			if got := classifyEvent([]byte(c.payload), &h); got != c.want {
				t.Errorf("classifyEvent = %d, want %d", got, c.want)
			}
			if got := classifyEvent([]byte(c.payload), nil); got != c.want {
				t.Errorf("without hints: %d, want %d", got, c.want)
			}
		})
	}
	// The hint follows the stream, and a chunk without output where the
	// last one had it is still seen as one without.
	var h chunkHints
	content := []byte(`{"id":"c","choices":[{"index":0,"delta":{"content":"Hi"}}]}`)
	empty := []byte(`{"id":"c","choices":[{"index":0,"delta":{"content":""}}]}`)
	for i, want := range []eventKind{evToken, evToken, evChoice, evToken} {
		p := content
		if want == evChoice {
			p = empty
		}
		if got := classifyEvent(p, &h); got != want {
			t.Errorf("chunk %d: %d, want %d", i, got, want)
		}
	}
}

// A stream whose first chunk carries the role alone, tens of milliseconds
// before the first token (as vLLM's chat streams do): the router's TTFT —
// its histogram, its records, what the replica's predictor learns — is
// the first token's, and the role chunk is no inter-token gap. For
// completions, a first chunk of empty text likewise.
func TestTTFTIsTheFirstChunkWithOutput(t *testing.T) {
	const lead = 80 * time.Millisecond
	up := newFakeVLLM(t)
	up.roleLead, up.tokens = lead, 3
	tr := startRouter(t, []string{up.url})
	for i, c := range []struct{ path, body string }{
		{"/v1/chat/completions", chatStream},
		{"/v1/completions", `{"model":"m","stream":true,"prompt":"hi"}`},
		{"/v1/chat/completions", chatStream},
	} {
		resp := post(t, tr.url+c.path, c.body)
		events := sseEvents(t, resp.Body)
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		if resp.StatusCode != 200 || len(events) == 0 || events[len(events)-1] != "[DONE]" {
			t.Fatalf("request %d: status %d, events %q", i, resp.StatusCode, events)
		}
		waitFor(t, "the record", func() bool { return len(tr.srv.records.since(0, 0)) == i+1 })
		rec := tr.srv.records.since(0, 0)[i]
		if rec.TTFTS < lead.Seconds() || rec.PlacedTTFTS < lead.Seconds() {
			t.Errorf("request %d (%s): TTFT %.3fs, placed %.3fs; want at least the role chunk's lead, %v", i, c.path, rec.TTFTS, rec.PlacedTTFTS, lead)
		}
		if rec.ITLCount != up.tokens-1 {
			t.Errorf("request %d: %d inter-token gaps, want %d (the role chunk is none)", i, rec.ITLCount, up.tokens-1)
		}
		if i > 0 && rec.PredictedTTFTS < lead.Seconds()/2 {
			t.Errorf("request %d: predicted TTFT %.3fs: the predictor learned a TTFT shorter than the first token's", i, rec.PredictedTTFTS)
		}
	}
	var sum float64
	for _, rec := range tr.srv.records.since(0, 0) {
		sum += rec.TTFTS
	}
	mfs, err := tr.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gpurouter_time_to_first_token_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if got := h.GetSampleSum(); h.GetSampleCount() != 3 || got < 3*lead.Seconds() || got > sum+1e-6 {
			t.Errorf("TTFT histogram: %d samples, sum %.3fs; want 3, at least 3×%v (records say %.3fs)", h.GetSampleCount(), got, lead, sum)
		}
		return
	}
	t.Error("no TTFT histogram")
}

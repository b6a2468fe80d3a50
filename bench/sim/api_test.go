package sim

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gpurouter/gpurouter/bench/tokens"
	"github.com/gpurouter/gpurouter/gpu"
)

func TestEndpoints(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]

	code, hdr, body := httpDo(t, "GET", u+"/health", "")
	if code != 200 || len(body) != 0 {
		t.Errorf("/health = %d %q, want 200 empty", code, body)
	}

	code, _, body = httpDo(t, "GET", u+"/v1/models", "")
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			OwnedBy     string `json:"owned_by"`
			Root        string `json:"root"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &models); err != nil || code != 200 {
		t.Fatalf("/v1/models = %d %s (%v)", code, body, err)
	}
	if len(models.Data) != 2 || models.Data[0].ID != "qwen" || models.Data[1].ID != "qwen-alias" ||
		models.Data[0].Root != "Qwen/Qwen2.5-7B-Instruct" || models.Data[0].MaxModelLen != 32768 {
		t.Errorf("/v1/models = %s", body)
	}

	est := testEstimator(t)
	prompt := "The quick brown fox jumps over the lazy dog, twice."
	code, _, body = httpDo(t, "POST", u+"/tokenize", fmt.Sprintf(`{"model":"qwen","prompt":%q}`, prompt))
	var tok struct {
		Count       int   `json:"count"`
		MaxModelLen int   `json:"max_model_len"`
		Tokens      []int `json:"tokens"`
	}
	if err := json.Unmarshal(body, &tok); err != nil || code != 200 {
		t.Fatalf("/tokenize = %d %s", code, body)
	}
	if tok.Count != est.Count(prompt) || len(tok.Tokens) != tok.Count || tok.MaxModelLen != 32768 {
		t.Errorf("/tokenize = %+v, want count %d", tok, est.Count(prompt))
	}
	code, _, body = httpDo(t, "POST", u+"/tokenize", `{"messages":[{"role":"user","content":"hi there"}]}`)
	if err := json.Unmarshal(body, &tok); err != nil || code != 200 ||
		tok.Count != est.CountChat([]tokens.Message{{Role: "user", Content: "hi there"}}) {
		t.Errorf("/tokenize chat = %d %s", code, body)
	}

	code, _, body = httpDo(t, "GET", u+"/v1/gpus", "")
	var rep gpu.HostReport
	if err := json.Unmarshal(body, &rep); err != nil || code != 200 || len(rep.GPUs) != 1 {
		t.Fatalf("/v1/gpus = %d %s", code, body)
	}
	if g := rep.GPUs[0]; g.Name != "NVIDIA A100-SXM4-80GB" || g.MemoryTotalBytes != 80<<30 || g.MemoryUsedBytes == 0 ||
		g.PowerWatts < 60 || g.SMClockMHz != 1410 {
		t.Errorf("gpu = %+v", g)
	}

	code, _, body = httpDo(t, "GET", u+"/nope", "")
	if code != 404 || !strings.Contains(string(body), "Not Found") {
		t.Errorf("/nope = %d %s", code, body)
	}
	code, _, _ = httpDo(t, "GET", u+"/v1/chat/completions", "")
	if code != 405 {
		t.Errorf("GET /v1/chat/completions = %d, want 405", code)
	}
	_ = hdr
}

func TestRequestErrors(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	long := strings.Repeat("word ", 40000)
	cases := []struct {
		name, path, body string
		status           int
		typ, contains    string
	}{
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`,
			404, "NotFoundError", "The model `gpt-9` does not exist."},
		{"bad json", "/v1/chat/completions", `{"model":`, 400, "BadRequestError", "invalid JSON"},
		{"no messages", "/v1/chat/completions", `{"model":"qwen"}`, 400, "BadRequestError", "messages"},
		{"no prompt", "/v1/completions", `{"model":"qwen"}`, 400, "BadRequestError", "prompt"},
		{"n=2", "/v1/chat/completions", `{"model":"qwen","n":2,"messages":[{"role":"user","content":"hi"}]}`,
			400, "BadRequestError", "n=2 is not supported"},
		{"two prompts", "/v1/completions", `{"model":"qwen","prompt":["a","b"]}`, 400, "BadRequestError", "one prompt"},
		{"max_tokens 0", "/v1/completions", `{"model":"qwen","prompt":"hi","max_tokens":0}`,
			400, "BadRequestError", "max_tokens must be at least 1"},
		{"too long", "/v1/completions", `{"model":"qwen","prompt":"hi","max_tokens":40000}`,
			400, "BadRequestError", "maximum context length is 32768 tokens"},
		{"prompt too long", "/v1/completions", `{"model":"qwen","prompt":"` + long + `"}`,
			400, "BadRequestError", "maximum context length"},
		{"stream options without stream", "/v1/completions",
			`{"model":"qwen","prompt":"hi","stream_options":{"include_usage":true}}`, 400, "BadRequestError", "stream=True"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, body := httpDo(t, "POST", u+c.path, c.body)
			var e apiErrorBody
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			if code != c.status || e.Error.Type != c.typ || e.Error.Code != c.status ||
				!strings.Contains(e.Error.Message, c.contains) {
				t.Errorf("got %d %s, want %d %s containing %q", code, body, c.status, c.typ, c.contains)
			}
		})
	}
}

func TestChatStream(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	s := openStream(t, u, "/v1/chat/completions",
		`{"model":"qwen-alias","stream":true,"stream_options":{"include_usage":true},"max_tokens":7,"ignore_eos":true,
		  "messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"tell me"}]}]}`,
		"X-Request-Id", "req-42")
	defer s.close()
	s.readHeader(t)
	if s.status != 200 || !strings.HasPrefix(s.header.Get("Content-Type"), "text/event-stream") ||
		s.header.Get("X-Request-Id") != "req-42" {
		t.Fatalf("status %d headers %v", s.status, s.header)
	}
	first := parseChunk(t, s.next(t))
	if first.Object != "chat.completion.chunk" || first.ID != "chatcmpl-req-42" || first.Model != "qwen" ||
		len(first.Choices) != 1 || first.Choices[0].Delta.Role == nil || *first.Choices[0].Delta.Role != "assistant" {
		t.Fatalf("first chunk %+v", first)
	}
	var text strings.Builder
	tokensSeen, finish := 0, ""
	var usage *chunk
	for {
		data := s.next(t)
		if data == "[DONE]" {
			break
		}
		if data == "" {
			t.Fatal("stream ended without [DONE]")
		}
		c := parseChunk(t, data)
		if len(c.Choices) == 0 {
			usage = &c
			continue
		}
		if c.Choices[0].Delta.Content != nil {
			// One word per token; a lagging reader gets several per chunk.
			text.WriteString(*c.Choices[0].Delta.Content)
			tokensSeen += len(strings.Fields(*c.Choices[0].Delta.Content))
		}
		if fr := c.Choices[0].FinishReason; fr != nil {
			finish = *fr
		}
	}
	if finish != "length" || tokensSeen != 7 {
		t.Errorf("finish %q after %d tokens, want length after 7", finish, tokensSeen)
	}
	est := testEstimator(t)
	wantPrompt := est.CountChat([]tokens.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "tell me"}})
	if usage == nil || usage.Usage.CompletionTokens != 7 || usage.Usage.PromptTokens != wantPrompt ||
		usage.Usage.TotalTokens != 7+wantPrompt {
		t.Errorf("usage %+v, want 7 completion, %d prompt", usage, wantPrompt)
	}
	if n := len(strings.Fields(text.String())); n != 7 {
		t.Errorf("text %q has %d words, want 7", text.String(), n)
	}
}

func TestCompletionNonStreaming(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	for _, c := range []struct {
		name, body string
		exact      int // 0 = any up to max
		max        int
	}{
		{"ignore_eos", `{"model":"qwen","prompt":"Once upon a time","max_tokens":25,"ignore_eos":true}`, 25, 25},
		{"drawn length", `{"model":"qwen","prompt":"Once upon a time","max_tokens":40}`, 0, 40},
		{"token ids", `{"model":"qwen","prompt":[1,2,3,4,5],"max_tokens":3,"ignore_eos":true}`, 3, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, body := httpDo(t, "POST", u+"/v1/completions", c.body)
			var resp struct {
				Object  string `json:"object"`
				Choices []struct {
					Text         string `json:"text"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(body, &resp); err != nil || code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			n := resp.Usage.CompletionTokens
			if resp.Object != "text_completion" || len(resp.Choices) != 1 || n < 1 || n > c.max ||
				(c.exact > 0 && n != c.exact) || len(strings.Fields(resp.Choices[0].Text)) != n {
				t.Errorf("response %s", body)
			}
			want := "stop"
			if n == c.max {
				want = "length"
			}
			if resp.Choices[0].FinishReason != want {
				t.Errorf("finish_reason %q, want %q (%d of %d tokens)", resp.Choices[0].FinishReason, want, n, c.max)
			}
		})
	}
}

// TestPrefixCacheOverHTTP sends the same long prompt twice: the second is
// served from the prefix cache, which the vLLM counters show.
func TestPrefixCacheOverHTTP(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	prompt := testEstimator(t).Synthesize(640, 11)
	body := fmt.Sprintf(`{"model":"qwen","prompt":%q,"max_tokens":2,"ignore_eos":true}`, prompt)
	httpDo(t, "POST", u+"/v1/completions", body)
	first := scrape(t, u)
	httpDo(t, "POST", u+"/v1/completions", body)
	second := scrape(t, u)
	if first["vllm:prefix_cache_hits_total"] != 0 || first["vllm:prefix_cache_queries_total"] != 640 {
		t.Errorf("first: %v", first)
	}
	if hits := second["vllm:prefix_cache_hits_total"]; hits != 624 { // all but the block holding the last token
		t.Errorf("second request hit %v tokens, want 624", hits)
	}
}

func TestRequestIDEscaped(t *testing.T) {
	f := fastFleet(t, 1)
	s := openStream(t, f.URLs()[0], "/v1/completions", `{"model":"qwen","stream":true,"prompt":"x","max_tokens":1}`,
		"X-Request-Id", `a"b\c`)
	defer s.close()
	s.readHeader(t)
	if c := parseChunk(t, s.next(t)); c.ID != `cmpl-a"b\c` {
		t.Errorf("id %q", c.ID)
	}
}

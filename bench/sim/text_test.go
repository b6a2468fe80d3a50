package sim

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// streamText sends a streaming request and returns the concatenated text,
// the generated token ids (when asked for) and the prompt's ids.
func streamText(t *testing.T, url, path, body string) (text string, ids, promptIDs []int) {
	t.Helper()
	s := openStream(t, url, path, body)
	defer s.close()
	s.readHeader(t)
	if s.status != 200 {
		t.Fatalf("status %d", s.status)
	}
	for {
		data := s.next(t)
		if data == "" {
			t.Fatal("stream ended without [DONE]")
		}
		if data == "[DONE]" {
			return text, ids, promptIDs
		}
		var c struct {
			PromptTokenIDs []int `json:"prompt_token_ids"`
			Choices        []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				Text           string `json:"text"`
				TokenIDs       []int  `json:"token_ids"`
				PromptTokenIDs []int  `json:"prompt_token_ids"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		promptIDs = append(promptIDs, c.PromptTokenIDs...)
		for _, ch := range c.Choices {
			text += ch.Delta.Content + ch.Text
			ids = append(ids, ch.TokenIDs...)
			promptIDs = append(promptIDs, ch.PromptTokenIDs...)
		}
	}
}

func idList(ids []int) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.Itoa(id)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// The generated text depends on the seed and the context only: the same
// request on two replicas gives the same text, and a continuation — the
// context plus a prefix of the text, as text or as token ids — gives the
// rest of it, as a router continuing a stream on another replica needs.
func TestTextIsDeterministicAndContinues(t *testing.T) {
	f := fastFleet(t, 2)
	u0, u1 := f.URLs()[0], f.URLs()[1]
	const seed, n, cut = 7, 24, 9
	comp := func(prompt string, max int) string {
		return fmt.Sprintf(`{"model":"qwen","prompt":%s,"max_tokens":%d,"ignore_eos":true,"seed":%d,"stream":true,"return_token_ids":true}`, prompt, max, seed)
	}
	full, ids, promptIDs := streamText(t, u0, "/v1/completions", comp(`"Tell me about item 42"`, n))
	if got := len(strings.Fields(full)); got != n || len(ids) != n {
		t.Fatalf("%d words and %d ids for %d tokens: %q", got, len(ids), n, full)
	}
	if len(promptIDs) == 0 {
		t.Fatal("no prompt_token_ids in the first chunk")
	}
	again, _, _ := streamText(t, u1, "/v1/completions", comp(`"Tell me about item 42"`, n))
	if again != full {
		t.Fatalf("same seed on another replica:\n%q\n%q", again, full)
	}
	other, _, _ := streamText(t, u1, "/v1/completions", strings.Replace(comp(`"Tell me about item 42"`, n), `"seed":7`, `"seed":8`, 1))
	if other == full {
		t.Errorf("another seed gave the same text")
	}
	// A word is " w": the prefix is the first cut words.
	prefix := strings.Join(strings.Fields(full)[:cut], " ")
	rest := full[len(" "+prefix):]

	t.Run("completions, prompt plus text", func(t *testing.T) {
		p, _ := json.Marshal("Tell me about item 42 " + prefix)
		got, _, _ := streamText(t, u1, "/v1/completions", comp(string(p), n-cut))
		if got != rest {
			t.Fatalf("continuation %q, want %q", got, rest)
		}
	})
	t.Run("completions, token ids", func(t *testing.T) {
		p := idList(append(append([]int(nil), promptIDs...), ids[:cut]...))
		got, _, _ := streamText(t, u1, "/v1/completions", comp(p, n-cut))
		if got != rest {
			t.Fatalf("continuation %q, want %q", got, rest)
		}
	})
	t.Run("chat, continue_final_message", func(t *testing.T) {
		chat := func(extra string, max int) string {
			return fmt.Sprintf(`{"model":"qwen","max_tokens":%d,"ignore_eos":true,"seed":%d,"stream":true,"messages":[{"role":"user","content":"Tell me about item 42"}%s]}`, max, seed, extra)
		}
		whole, _, _ := streamText(t, u0, "/v1/chat/completions", chat("", n))
		if whole != full {
			t.Fatalf("chat %q, completions %q: the context's last word decides both", whole, full)
		}
		partial, _ := json.Marshal(" " + prefix)
		body := chat(`,{"role":"assistant","content":`+string(partial)+`}`, n-cut)
		body = strings.Replace(body, `"stream":true`, `"stream":true,"continue_final_message":true,"add_generation_prompt":false`, 1)
		got, _, _ := streamText(t, u1, "/v1/chat/completions", body)
		if got != rest {
			t.Fatalf("continuation %q, want %q", got, rest)
		}
	})
}

func TestContinueFinalMessageNeedsAnAssistantMessageAndNoGenerationPrompt(t *testing.T) {
	f := fastFleet(t, 1)
	for _, body := range []string{
		`{"model":"qwen","continue_final_message":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"qwen","continue_final_message":true,"add_generation_prompt":false,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		if code, _, b := httpDo(t, "POST", f.URLs()[0]+"/v1/chat/completions", body); code != 400 {
			t.Errorf("%s: %d %s", body, code, b)
		}
	}
}

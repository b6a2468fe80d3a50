package proxy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// The official SDK, unchanged, against the router over a fake vLLM: it must
// stream and not stream, chat and completions, and see exact usage.
func TestOpenAISDKThroughRouter(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens = 6
	tr := startRouter(t, []string{up.url})
	client := openai.NewClient(option.WithBaseURL(tr.url+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	chatParams := openai.ChatCompletionNewParams{
		Model:    "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")},
	}

	t.Run("chat", func(t *testing.T) {
		res, err := client.Chat.Completions.New(ctx, chatParams)
		if err != nil {
			t.Fatal(err)
		}
		if res.Usage.CompletionTokens != 6 || res.Usage.PromptTokens != 7 || !strings.HasPrefix(res.Choices[0].Message.Content, "tok") {
			t.Errorf("usage %+v content %q", res.Usage, res.Choices[0].Message.Content)
		}
	})
	t.Run("chat streaming with usage", func(t *testing.T) {
		p := chatParams
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(ctx, p)
		acc := openai.ChatCompletionAccumulator{}
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if acc.Usage.CompletionTokens != 6 || acc.Usage.PromptTokens != 7 {
			t.Errorf("usage %+v", acc.Usage)
		}
		if got := acc.Choices[0].Message.Content; got != "tok0 tok1 tok2 tok3 tok4 tok5 " {
			t.Errorf("content %q", got)
		}
	})
	t.Run("chat streaming without usage", func(t *testing.T) {
		stream := client.Chat.Completions.NewStreaming(ctx, chatParams)
		chunks := 0
		for stream.Next() {
			if c := stream.Current(); len(c.Choices) == 0 {
				t.Errorf("client got a usage-only chunk it did not ask for: %+v", c)
			}
			chunks++
		}
		if err := stream.Err(); err != nil || chunks != 7 {
			t.Errorf("chunks %d err %v", chunks, err)
		}
	})
	complParams := openai.CompletionNewParams{
		Model:  "m",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon")},
	}
	t.Run("completion", func(t *testing.T) {
		res, err := client.Completions.New(ctx, complParams)
		if err != nil {
			t.Fatal(err)
		}
		if res.Usage.CompletionTokens != 6 || res.Usage.PromptTokens != 7 {
			t.Errorf("usage %+v", res.Usage)
		}
	})
	t.Run("completion streaming with usage", func(t *testing.T) {
		p := complParams
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Completions.NewStreaming(ctx, p)
		var text string
		var usage openai.CompletionUsage
		for stream.Next() {
			c := stream.Current()
			for _, ch := range c.Choices {
				text += ch.Text
			}
			if c.Usage.TotalTokens > 0 {
				usage = c.Usage
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if usage.CompletionTokens != 6 || usage.PromptTokens != 7 || !strings.HasPrefix(text, "tok0 ") {
			t.Errorf("usage %+v text %q", usage, text)
		}
	})
	t.Run("unknown model is a typed SDK error", func(t *testing.T) {
		p := chatParams
		p.Model = "nope"
		_, err := client.Chat.Completions.New(ctx, p)
		var apiErr *openai.Error
		if err == nil || !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
			t.Fatalf("err %v, want a 404 openai.Error", err)
		}
	})
}

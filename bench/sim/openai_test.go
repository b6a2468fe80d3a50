package sim

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/gpurouter/gpurouter/bench/tokens"
)

// TestOpenAISDK drives a replica with the official Go SDK, unchanged: chat
// streaming (with the SDK's accumulator), chat non-streaming and
// completions, checking usage is exact.
func TestOpenAISDK(t *testing.T) {
	f := fastFleet(t, 1)
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	client := openai.NewClient(option.WithBaseURL(f.URLs()[0]+"/v1"), option.WithAPIKey("unused"),
		option.WithMaxRetries(0), option.WithHTTPClient(&http.Client{Transport: transport}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	est := testEstimator(t)
	question := "Write a haiku about GPUs"
	wantPrompt := est.CountChat([]tokens.Message{{Role: "user", Content: question}})

	t.Run("chat streaming", func(t *testing.T) {
		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:               "qwen",
			Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage(question)},
			MaxCompletionTokens: openai.Int(12),
			StreamOptions:       openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		}, option.WithJSONSet("ignore_eos", true))
		defer stream.Close()
		acc := openai.ChatCompletionAccumulator{}
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "length" ||
			len(strings.Fields(acc.Choices[0].Message.Content)) != 12 {
			t.Errorf("accumulated %+v after %d chunks", acc.ChatCompletion, chunks)
		}
		if u := acc.Usage; u.CompletionTokens != 12 || u.PromptTokens != int64(wantPrompt) || u.TotalTokens != 12+int64(wantPrompt) {
			t.Errorf("usage %+v, want 12 + %d", u, wantPrompt)
		}
	})

	t.Run("chat", func(t *testing.T) {
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "qwen-alias",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(question)},
			MaxTokens: openai.Int(9),
		}, option.WithJSONSet("ignore_eos", true))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Model != "qwen" || len(resp.Choices) != 1 || resp.Usage.CompletionTokens != 9 ||
			resp.Usage.PromptTokens != int64(wantPrompt) || len(strings.Fields(resp.Choices[0].Message.Content)) != 9 {
			t.Errorf("response %+v", resp)
		}
	})

	t.Run("completions", func(t *testing.T) {
		prompt := "The simulator says"
		resp, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:     "qwen",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
			MaxTokens: openai.Int(5),
		}, option.WithJSONSet("ignore_eos", true))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Usage.CompletionTokens != 5 || resp.Usage.PromptTokens != int64(est.Count(prompt)) ||
			resp.Choices[0].FinishReason != "length" {
			t.Errorf("response %+v", resp)
		}
	})

	t.Run("completions streaming", func(t *testing.T) {
		stream := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:         "qwen",
			Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String("count")},
			MaxTokens:     openai.Int(6),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		}, option.WithJSONSet("ignore_eos", true))
		defer stream.Close()
		var text strings.Builder
		var usage int64
		for stream.Next() {
			c := stream.Current()
			if len(c.Choices) > 0 {
				text.WriteString(c.Choices[0].Text)
			}
			if c.Usage.CompletionTokens > 0 {
				usage = c.Usage.CompletionTokens
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if usage != 6 || len(strings.Fields(text.String())) != 6 {
			t.Errorf("text %q usage %d", text.String(), usage)
		}
	})

	t.Run("unknown model", func(t *testing.T) {
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "nope",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		if err == nil || !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(apiErr.Message, "does not exist") {
			t.Errorf("err %v", err)
		}
	})
}

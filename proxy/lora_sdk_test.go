package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/bench/sim"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// loraSims runs two simulated replicas of model "m" serving the LoRA
// adapters sql-lora and chat-lora (--enable-lora --max-loras 2).
func loraSims(t *testing.T) *sim.Fleet {
	t.Helper()
	p, err := sim.Builtin("qwen2.5-7b")
	if err != nil {
		t.Fatal(err)
	}
	p.Engine.EnableLoRA, p.Engine.MaxLoRAs = true, 2
	return runSims(t, sim.FleetConfig{Replicas: 2, Profiles: []sim.Profile{p}, ServedModelNames: []string{"m"}, Seed: 5,
		LoRAModules: []sim.LoRAModule{{Name: "sql-lora", Path: "/adapters/sql"}, {Name: "chat-lora", Path: "/adapters/chat"}}})
}

// The official SDK calls a LoRA adapter by name through the router,
// streamed and not: the request goes to the adapter's base model's pool
// and the replica runs it under that name (the simulator, as vLLM, answers
// 404 for an adapter it does not serve). /v1/models lists the adapters
// with their parent; a name no pool has is the router's 404.
func TestOpenAISDKLoRAAdapter(t *testing.T) {
	f := loraSims(t)
	tr := startRouter(t, f.URLs(), func(_ *Config, pc *balancer.PoolConfig, _ *balancer.BreakerConfig) {
		pc.Policy = "predictive"
		pc.LoRA.Adapters = []string{"sql-lora"} // declared; chat-lora is learned below
	})
	tr.pool.LearnAdapters([]string{"chat-lora"})
	client := openai.NewClient(option.WithBaseURL(tr.url+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("models", func(t *testing.T) {
		resp, err := http.Get(tr.url + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var doc struct {
			Data []struct {
				ID     string `json:"id"`
				Parent string `json:"parent"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		parents := map[string]string{}
		for _, m := range doc.Data {
			parents[m.ID] = m.Parent
		}
		if p, ok := parents["m"]; !ok || p != "" || parents["sql-lora"] != "m" || parents["chat-lora"] != "m" {
			t.Fatalf("/v1/models: %+v", doc.Data)
		}
		page, err := client.Models.List(ctx)
		if err != nil || len(page.Data) != 4 { // m, m-alias and the two adapters
			t.Fatalf("SDK models: %v %+v", err, page)
		}
	})
	for _, adapter := range []string{"sql-lora", "chat-lora"} {
		params := openai.ChatCompletionNewParams{
			Model:     adapter,
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("SELECT the answer")},
			MaxTokens: openai.Int(5),
		}
		t.Run(adapter+" chat", func(t *testing.T) {
			res, err := client.Chat.Completions.New(ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			if res.Model != adapter || res.Usage.CompletionTokens != 5 || res.Choices[0].Message.Content == "" {
				t.Fatalf("model %q usage %+v content %q", res.Model, res.Usage, res.Choices[0].Message.Content)
			}
		})
		t.Run(adapter+" chat streaming", func(t *testing.T) {
			stream := client.Chat.Completions.NewStreaming(ctx, params)
			acc := openai.ChatCompletionAccumulator{}
			for stream.Next() {
				if c := stream.Current(); c.Model != adapter {
					t.Fatalf("chunk of model %q", c.Model)
				}
				acc.AddChunk(stream.Current())
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if acc.Choices[0].Message.Content == "" {
				t.Fatal("no content")
			}
		})
	}
	t.Run("completion", func(t *testing.T) {
		res, err := client.Completions.New(ctx, openai.CompletionNewParams{Model: "sql-lora",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("SELECT")}, MaxTokens: openai.Int(3)})
		if err != nil || res.Model != "sql-lora" || res.Usage.CompletionTokens != 3 {
			t.Fatalf("%v %+v", err, res)
		}
	})
	t.Run("unknown adapter", func(t *testing.T) {
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "nope-lora",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
			t.Fatalf("want the router's 404, got %v", err)
		}
	})
}

package sim

import (
	"encoding/json"
	"fmt"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gpurouter/gpurouter/bench/tokens"
	"github.com/gpurouter/gpurouter/prefixcache"
)

// Handler returns the replica's HTTP API as a fasthttp handler, for mounting
// in a server of your own. Serve is the usual way: only it can imitate a
// crash's refused connections.
func (r *Replica) Handler() fasthttp.RequestHandler {
	inc := r.newIncarnation()
	inc.quit = r.stopped
	return inc.handle
}

// handle routes one HTTP request: vLLM's OpenAI-compatible API, /metrics,
// /health, /v1/gpus (the `gpurouter agent` document) and /sim/faults.
func (inc *incarnation) handle(ctx *fasthttp.RequestCtx) {
	r := inc.r
	// uvicorn, vLLM's server, writes the header names it is given in lower
	// case (retry-after, x-request-id); HTTP/1.1 names are case-insensitive
	// and a client must read them so. fasthttp still writes the names of
	// the headers it holds apart (Content-Type, Content-Length, Date)
	// capitalized.
	ctx.Response.Header.DisableNormalizing()
	path := string(ctx.Path())
	if path == "/sim/faults" {
		inc.serveFaults(ctx)
		return
	}
	if r.isDown(time.Now()) {
		dropConn(ctx)
		return
	}
	if f := r.faults.Load(); f.CloseAfterResponse {
		closeAfterResponse(ctx, secondsDur(f.CloseLagSeconds))
	}
	if id := ctx.Request.Header.Peek("X-Request-Id"); len(id) > 0 {
		ctx.Response.Header.SetBytesV("x-request-id", id)
	}
	r.traces.record(ctx, path)
	if r.faults.Load().HangAll {
		inc.hang(ctx)
		return
	}
	get, post := ctx.IsGet(), ctx.IsPost()
	switch {
	case path == "/v1/chat/completions" && post:
		inc.inference(ctx, true)
	case path == "/v1/completions" && post:
		inc.inference(ctx, false)
	case path == "/v1/models" && get:
		r.serveModels(ctx)
	case path == "/health" && get:
		r.serveHealth(ctx)
	case path == "/metrics" && get:
		r.serveMetrics(ctx)
	case path == "/tokenize" && post:
		r.serveTokenize(ctx)
	case path == "/v1/gpus" && get:
		r.serveGPUs(ctx)
	case path == "/ping" && (get || post):
		ctx.SetStatusCode(fasthttp.StatusOK)
	case path == "/version" && get:
		writeJSON(ctx, fasthttp.StatusOK, map[string]string{"version": "0.11.0+gpurouter.sim"})
	case path == "/load" && get:
		writeJSON(ctx, fasthttp.StatusOK, map[string]int64{"server_load": r.inflight.Load()})
	case path == "/v1/load_lora_adapter" && post && r.cfg.AllowRuntimeLoRAUpdating:
		inc.serveLoadLoRA(ctx)
	case path == "/v1/unload_lora_adapter" && post && r.cfg.AllowRuntimeLoRAUpdating:
		inc.serveUnloadLoRA(ctx)
	default:
		switch path {
		case "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/tokenize",
			"/v1/gpus", "/ping", "/version", "/load":
			writeMethodNotAllowed(ctx)
		case "/v1/load_lora_adapter", "/v1/unload_lora_adapter":
			// vLLM has these routes only with VLLM_ALLOW_RUNTIME_LORA_UPDATING.
			if r.cfg.AllowRuntimeLoRAUpdating {
				writeMethodNotAllowed(ctx)
			} else {
				writeJSON(ctx, fasthttp.StatusNotFound, map[string]string{"detail": "Not Found"})
			}
		default:
			writeJSON(ctx, fasthttp.StatusNotFound, map[string]string{"detail": "Not Found"})
		}
	}
}

// dropConn closes the connection without answering, as a dead process does.
func dropConn(ctx *fasthttp.RequestCtx) {
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) {})
}

// hang holds the request without answering until the client leaves or the
// server stops, then drops the connection.
func (inc *incarnation) hang(ctx *fasthttp.RequestCtx) {
	q := &request{r: inc.r, inc: inc, conn: ctx.Conn(), notify: make(chan struct{}, 1)}
	inc.r.watch(q)
	defer inc.r.unwatch(q)
	select {
	case <-q.notify:
	case <-inc.quit:
	}
	dropConn(ctx)
}

// apiErrorBody is vLLM's error document (v0.10.1+): code is the HTTP status.
type apiErrorBody struct {
	Error apiErrorInfo `json:"error"`
}

type apiErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func writeError(ctx *fasthttp.RequestCtx, status int, typ, msg string) {
	writeJSON(ctx, status, apiErrorBody{Error: apiErrorInfo{Message: msg, Type: typ, Code: status}})
}

func writeBadRequest(ctx *fasthttp.RequestCtx, msg string) {
	writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", msg)
}

func writeMethodNotAllowed(ctx *fasthttp.RequestCtx) {
	writeJSON(ctx, fasthttp.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = fasthttp.StatusInternalServerError, []byte(`{"detail":"encoding error"}`)
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// inferenceRequest is the subset of vLLM's ChatCompletionRequest and
// CompletionRequest that the simulator reads; other fields are accepted and
// ignored.
type inferenceRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	MinTokens           int             `json:"min_tokens"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	N                   *int            `json:"n"`
	// Seed makes the generated text reproducible (text.go), as vLLM's
	// seed makes its sampling so.
	Seed *int64 `json:"seed"`
	// ReturnTokenIDs is vLLM's return_token_ids (0.10.2+): token ids of
	// the prompt and of every chunk alongside the text.
	ReturnTokenIDs bool `json:"return_token_ids"`
	// ContinueFinalMessage and AddGenerationPrompt are vLLM's chat
	// template switches: with the first, the last (assistant) message is
	// continued rather than answered.
	ContinueFinalMessage bool  `json:"continue_final_message"`
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	// KVTransferParams is vLLM's kv_transfer_params (prefill/decode
	// disaggregation, kvtransfer.go); read only by a replica with a KV
	// connector.
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

type streamOptions struct {
	IncludeUsage *bool `json:"include_usage"` // vLLM: true when stream_options is sent
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// text returns a message's content: a string, or the text parts of an
// array of content parts.
func (m chatMessage) text() (string, error) {
	if len(m.Content) == 0 || string(m.Content) == "null" {
		return "", nil
	}
	if m.Content[0] == '"' {
		var s string
		err := json.Unmarshal(m.Content, &s)
		return s, err
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", fmt.Errorf("content must be a string or an array of parts")
	}
	var s string
	for _, p := range parts {
		s += p.Text
	}
	return s, nil
}

// promptInfo is a parsed prompt: its size, its prefix-cache block hashes,
// its last token (where the generated text starts from), for a prompt of
// token ids the ids, and with prefix caching on, the token ids the engine
// caches.
type promptInfo struct {
	tokens int
	hashes []uint64
	end    contextEnd
	ids    []int
	toks   []uint32
}

// parsePrompt sizes the prompt of a chat or completion request and, with
// prefix caching on, hashes its full blocks. With prefix caching on it
// tokenizes for real (cl100k_base; chat messages rendered ChatML-style by
// prefixcache.CL100KChat, exactly as long as the shared estimator counts
// them) and hashes blocks over the token ids, chained as vLLM does, so a
// router that keys blocks by the same tokens (package prefixcache) sees
// what the engine caches. Without it, it only counts.
func (r *Replica) parsePrompt(req *inferenceRequest, chat bool) (promptInfo, error) {
	var pi promptInfo
	caching := r.cfg.Profile.Engine.EnablePrefixCaching
	if chat {
		if len(req.Messages) == 0 {
			return pi, fmt.Errorf("messages is required")
		}
		if req.ContinueFinalMessage && req.Messages[len(req.Messages)-1].Role != "assistant" {
			return pi, fmt.Errorf("continue_final_message is set but the last message is not from the assistant")
		}
		msgs := make([]tokens.Message, len(req.Messages))
		for i, m := range req.Messages {
			t, err := m.text()
			if err != nil {
				return pi, fmt.Errorf("messages[%d]: %w", i, err)
			}
			msgs[i] = tokens.Message{Role: m.Role, Content: t}
			if w := lastWord(t); w != "" {
				pi.end = contextEnd{word: w}
			}
		}
		if caching {
			pm := make([]prefixcache.Message, len(msgs))
			for i, m := range msgs {
				pm[i] = prefixcache.Message{Role: m.Role, Content: m.Content}
			}
			pi.toks = prefixcache.CL100KChat().AppendChat(nil, r.bpe, pm)
			pi.tokens = len(pi.toks)
		} else {
			pi.tokens = r.est.CountChat(msgs)
		}
	} else {
		text, ids, err := parseCompletionPrompt(req.Prompt)
		if err != nil {
			return pi, err
		}
		switch {
		case ids != nil:
			pi.tokens, pi.ids = len(ids), ids
			if len(ids) > 0 {
				pi.end = contextEnd{id: ids[len(ids)-1], isID: true}
			}
			if caching {
				pi.toks = make([]uint32, len(ids))
				for i, id := range ids {
					pi.toks[i] = uint32(id)
				}
			}
		case caching:
			pi.toks = r.bpe.AppendTokens(nil, text)
			pi.tokens = len(pi.toks)
			pi.end = contextEnd{word: lastWord(text)}
		default:
			pi.tokens = r.est.Count(text)
			pi.end = contextEnd{word: lastWord(text)}
		}
	}
	if pi.tokens == 0 {
		pi.tokens = 1 // the BOS token: an empty prompt is still one token to vLLM
	}
	if caching {
		pi.hashes = prefixcache.AppendKeys(nil, r.hashSeed, pi.toks, r.d.blockSize)
		for i, h := range pi.hashes {
			pi.hashes[i] = nonzero(h) // 0 marks an uncached block in kvCache
		}
	}
	return pi, nil
}

// parseCompletionPrompt accepts a string, a one-element list of strings, a
// list of token ids, or a one-element list of those.
func parseCompletionPrompt(raw json.RawMessage) (string, []int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, fmt.Errorf("prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 {
			return "", nil, fmt.Errorf("the simulator takes one prompt per request, got %d", len(ss))
		}
		return ss[0], nil, nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		return "", ids, nil
	}
	var idss [][]int
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) != 1 {
			return "", nil, fmt.Errorf("the simulator takes one prompt per request, got %d", len(idss))
		}
		return "", idss[0], nil
	}
	return "", nil, fmt.Errorf("prompt must be a string, a list of strings or a list of token ids")
}

func (r *Replica) knownModel(name string) bool {
	if name == "" {
		return true // vLLM serves the default model when none is named
	}
	for _, n := range r.names {
		if n == name {
			return true
		}
	}
	return false
}

// modelPermission and modelCard are vLLM's ModelPermission and ModelCard
// (GET /v1/models).
type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        string            `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen *int              `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

func (r *Replica) modelCard(id, root string, parent *string, maxModelLen *int) modelCard {
	return modelCard{ID: id, Object: "model", Created: r.created, OwnedBy: "vllm", Root: root, Parent: parent,
		MaxModelLen: maxModelLen,
		Permission: []modelPermission{{ID: "modelperm-sim", Object: "model_permission", Created: r.created,
			AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*"}}}
}

// serveModels lists the served names, then the LoRA adapters, as vLLM's
// show_available_models.
func (r *Replica) serveModels(ctx *fasthttp.RequestCtx) {
	list := struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{Object: "list"}
	maxLen := r.d.maxModelLen
	for _, n := range r.names {
		list.Data = append(list.Data, r.modelCard(n, r.cfg.Profile.Model.Name, nil, &maxLen))
	}
	list.Data = append(list.Data, r.loraModelCards()...)
	writeJSON(ctx, fasthttp.StatusOK, list)
}

func (r *Replica) serveHealth(ctx *fasthttp.RequestCtx) {
	f := r.faults.Load()
	ok := !f.Dead
	switch f.Health {
	case "ok":
		ok = true
	case "fail":
		ok = false
	}
	if ok {
		ctx.SetStatusCode(fasthttp.StatusOK)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
}

func (r *Replica) serveMetrics(ctx *fasthttp.RequestCtx) {
	now := time.Now()
	age := time.Duration(r.faults.Load().StaleMetricsSeconds * 1e9)
	body, err := r.expo.at(now, age)
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, "InternalServerError", err.Error())
		return
	}
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	ctx.SetBody(body)
}

func (r *Replica) serveTokenize(ctx *fasthttp.RequestCtx) {
	var req inferenceRequest
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeBadRequest(ctx, "invalid JSON body: "+err.Error())
		return
	}
	if _, ok := r.resolveModel(req.Model); !ok {
		writeError(ctx, fasthttp.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	pi, err := r.parsePrompt(&req, len(req.Messages) > 0)
	if err != nil {
		writeBadRequest(ctx, err.Error())
		return
	}
	ids := make([]int, pi.tokens)
	for i := range ids {
		ids[i] = 1000 + i%30000 // stand-ins: the count is what matters
	}
	writeJSON(ctx, fasthttp.StatusOK, struct {
		Count       int     `json:"count"`
		MaxModelLen int     `json:"max_model_len"`
		Tokens      []int   `json:"tokens"`
		TokenStrs   *string `json:"token_strs"`
	}{Count: pi.tokens, MaxModelLen: r.d.maxModelLen, Tokens: ids})
}

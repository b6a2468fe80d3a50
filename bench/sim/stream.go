package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

var (
	errAborted  = errors.New("sim: request aborted")
	errShutdown = errors.New("sim: replica stopping")
)

// request is one inference request in flight: the engine emits tokens into
// it, and the response side (a streaming body reader on the connection's
// goroutine, or the waiting handler for non-streaming requests) turns them
// into vLLM's response shapes.
type request struct {
	r     *Replica
	inc   *incarnation
	s     *seq
	conn  net.Conn
	widx  int // position+1 in Replica.waiting, 0 when not there; guarded by waiting.mu
	chat  bool
	usage bool // send the usage chunk (stream_options.include_usage)

	id      string
	idJSON  []byte // id, JSON-quoted
	model   []byte // JSON-quoted served model name
	created int64

	// The generated text (text.go): gen0 where it starts, gen where the
	// writer stands. tokenIDs is vLLM's return_token_ids: every chunk
	// carries its tokens' ids, the first the prompt's (promptIDs when the
	// prompt was token ids, else stand-ins).
	gen0, gen textGen
	tokenIDs  bool
	promptIDs []int
	sentIDs   bool // the prompt's ids went out

	mu      sync.Mutex // guards pending, total, reason
	pending int        // tokens emitted and not yet written
	total   int
	reason  finishReason
	notify  chan struct{} // cap 1: something changed

	// Used only by the goroutine writing the response.
	out     []byte
	off     int
	written int // tokens written
	began   bool
	eof     bool
}

func (q *request) emit(n int, reason finishReason, _ time.Time) {
	q.mu.Lock()
	q.pending += n
	q.total += n
	if q.reason == reasonNone {
		q.reason = reason
	}
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// disconnected is called by the sweeper when the client has gone.
func (q *request) disconnected() {
	if q.s == nil { // a hung request: just wake the handler
		q.emit(0, reasonAbort, time.Time{})
		return
	}
	q.r.abort(q)
}

// abort ends q's sequence now, freeing its KV blocks (no-op if it ended).
func (r *Replica) abort(q *request) {
	r.mu.Lock()
	r.eng.abort(q.s, time.Now())
	r.mu.Unlock()
}

func (q *request) snapshot() (pending, total int, reason finishReason) {
	q.mu.Lock()
	defer q.mu.Unlock()
	pending, total, reason = q.pending, q.total, q.reason
	q.pending = 0
	return
}

// Read makes request a streaming body (fasthttp.Response.SetBodyStream with
// unknown length): fasthttp writes and flushes what each call returns. It
// blocks until tokens arrive; an abort (crash, shutdown) ends the stream
// with an error, which makes fasthttp drop the connection mid-stream.
func (q *request) Read(p []byte) (int, error) {
	for q.off >= len(q.out) {
		if q.eof {
			return 0, io.EOF
		}
		q.out, q.off = q.out[:0], 0
		n, _, reason := q.snapshot()
		if reason == reasonAbort {
			return 0, errAborted
		}
		if reason == reasonError {
			// As vLLM streams an engine error: one error event, then [DONE].
			q.r.unwatch(q)
			q.out = appendErrorEvent(q.out, kvLoadFailedMessage)
			q.out = append(q.out, "data: [DONE]\n\n"...)
			q.eof = true
			continue
		}
		if n == 0 && reason == reasonNone {
			select {
			case <-q.notify:
			case <-q.inc.quit:
				return 0, errShutdown
			case <-q.r.stopped:
				return 0, errShutdown
			}
			continue
		}
		if !q.began {
			q.began = true
			q.r.unwatch(q) // writes now tell us about disconnects
			if q.chat {
				q.out = q.appendChunk(q.out, -1, reasonNone)
			}
		}
		q.out = q.appendChunk(q.out, n, reason)
		if reason != reasonNone {
			if q.usage {
				q.out = q.appendUsage(q.out)
			}
			q.out = append(q.out, "data: [DONE]\n\n"...)
			q.eof = true
		}
	}
	n := copy(p, q.out[q.off:])
	q.off += n
	return n, nil
}

// CloseWithError is called by fasthttp when the body is done: err is the
// client write error if the client went away, and then the sequence is
// aborted at once.
func (q *request) CloseWithError(err error) error {
	q.r.unwatch(q)
	if err != nil || !q.eof {
		q.r.abort(q)
	}
	q.r.inflight.Add(-1)
	return nil
}

// appendChunk appends one SSE event with n tokens of text (n = -1: the chat
// role chunk), carrying finish_reason when the sequence ended. With
// return_token_ids, as vLLM: the chunk's token ids in its choice, and the
// prompt's once — at the top of the chat role chunk, in the choice of a
// completion's first chunk.
func (q *request) appendChunk(b []byte, n int, reason finishReason) []byte {
	b = append(b, `data: {"id":`...)
	b = append(b, q.idJSON...)
	if q.chat {
		b = append(b, `,"object":"chat.completion.chunk","created":`...)
	} else {
		b = append(b, `,"object":"text_completion","created":`...)
	}
	b = strconv.AppendInt(b, q.created, 10)
	b = append(b, `,"model":`...)
	b = append(b, q.model...)
	g := q.gen
	if q.chat {
		b = append(b, `,"choices":[{"index":0,"delta":{`...)
		if n < 0 {
			b = append(b, `"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
			if q.tokenIDs && !q.sentIDs {
				q.sentIDs = true
				b = append(b, `,"prompt_token_ids":`...)
				b = q.appendPromptIDs(b)
			}
			return append(b, "}\n\n"...)
		}
		b = append(b, `"content":"`...)
		b = q.appendText(b, n)
		b = append(b, `"},"logprobs":null,"finish_reason":`...)
	} else {
		b = append(b, `,"choices":[{"index":0,"text":"`...)
		b = q.appendText(b, n)
		b = append(b, `","logprobs":null,"finish_reason":`...)
	}
	if reason == reasonNone {
		b = append(b, `null`...)
	} else {
		b = append(b, '"')
		b = append(b, reason.String()...)
		b = append(b, '"')
	}
	b = append(b, `,"stop_reason":null`...)
	if q.tokenIDs {
		if !q.chat && !q.sentIDs {
			q.sentIDs = true
			b = append(b, `,"prompt_token_ids":`...)
			b = q.appendPromptIDs(b)
		}
		b = append(b, `,"token_ids":[`...)
		for i := 0; i < n; i++ {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(vocabBase+g.word(len(q.r.words))), 10)
		}
		b = append(b, ']')
	}
	b = append(b, "}]}\n\n"...)
	return b
}

// appendText appends the next n generated tokens (JSON-safe words).
func (q *request) appendText(b []byte, n int) []byte {
	w := q.r.words
	for i := 0; i < n; i++ {
		b = append(b, w[q.gen.word(len(w))]...)
		q.written++
	}
	return b
}

func (q *request) appendUsage(b []byte) []byte {
	b = append(b, `data: {"id":`...)
	b = append(b, q.idJSON...)
	if q.chat {
		b = append(b, `,"object":"chat.completion.chunk","created":`...)
	} else {
		b = append(b, `,"object":"text_completion","created":`...)
	}
	b = strconv.AppendInt(b, q.created, 10)
	b = append(b, `,"model":`...)
	b = append(b, q.model...)
	b = append(b, `,"choices":[],"usage":`...)
	b = q.appendUsageObject(b)
	b = append(b, "}\n\n"...)
	return b
}

func (q *request) appendUsageObject(b []byte) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(q.s.prompt), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(q.s.prompt+q.written), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(q.written), 10)
	return append(b, '}')
}

// inference serves POST /v1/chat/completions and /v1/completions.
func (inc *incarnation) inference(ctx *fasthttp.RequestCtx, chat bool) {
	r := inc.r
	f := r.faults.Load()
	if f.Hang {
		inc.hang(ctx)
		return
	}
	if f.Dead {
		writeError(ctx, fasthttp.StatusInternalServerError, "InternalServerError",
			"EngineCore encountered an issue. See stack trace (above) for the root cause.")
		return
	}
	if f.RateLimited {
		writeTooManyRequests(ctx, f, "The server is not accepting requests (rate_limited fault). Please retry later.")
		return
	}
	if f.ErrorRate > 0 {
		r.mu.Lock()
		fail := r.rng.Float64() < f.ErrorRate
		r.mu.Unlock()
		if fail {
			writeError(ctx, f.errorStatus(), "InternalServerError", "simulated failure (error_rate fault)")
			return
		}
	}

	arrival := time.Now()
	var req inferenceRequest
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeBadRequest(ctx, "invalid JSON body: "+err.Error())
		return
	}
	adapter, ok := r.resolveModel(req.Model)
	if !ok {
		writeError(ctx, fasthttp.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	if req.N != nil && *req.N != 1 {
		writeBadRequest(ctx, fmt.Sprintf("n=%d is not supported: the simulator generates exactly one choice (n=1)", *req.N))
		return
	}
	if req.StreamOptions != nil && !req.Stream {
		writeBadRequest(ctx, "Stream options can only be defined when `stream=True`.")
		return
	}
	if req.ContinueFinalMessage && (req.AddGenerationPrompt == nil || *req.AddGenerationPrompt) {
		writeBadRequest(ctx, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
		return
	}
	pi, err := r.parsePrompt(&req, chat)
	if err != nil {
		writeBadRequest(ctx, err.Error())
		return
	}
	maxTokens := r.d.maxModelLen - pi.tokens
	if req.MaxCompletionTokens != nil {
		maxTokens = *req.MaxCompletionTokens
	} else if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	if maxTokens < 1 {
		if req.MaxTokens == nil && req.MaxCompletionTokens == nil {
			maxTokens = 1 // the prompt alone fills the context: reported below
		} else {
			writeBadRequest(ctx, fmt.Sprintf("max_tokens must be at least 1, got %d.", maxTokens))
			return
		}
	}
	if err := r.eng.check(pi.tokens, maxTokens); err != nil {
		writeBadRequest(ctx, err.Error())
		return
	}
	kv, err := r.kvParams(req.KVTransferParams, pi.tokens)
	if err != nil {
		writeBadRequest(ctx, err.Error())
		return
	}

	q := &request{r: r, inc: inc, conn: ctx.Conn(), chat: chat, created: arrival.Unix(), notify: make(chan struct{}, 1)}
	q.usage = req.StreamOptions != nil && (req.StreamOptions.IncludeUsage == nil || *req.StreamOptions.IncludeUsage)
	q.model, _ = json.Marshal(r.names[0])
	s := &seq{prompt: pi.tokens, maxTokens: maxTokens, hashes: pi.hashes, sink: q, arrival: arrival, lora: adapter, kv: kv}
	if adapter != nil {
		q.model, _ = json.Marshal(adapter.name) // vLLM answers with the adapter's name
	}
	if r.pub != nil {
		s.ids = pi.toks // what BlockStored events report
	}
	q.s = s

	// The frontend's own time (HTTP, template, tokenisation) before the
	// engine sees the request.
	p := r.cfg.Profile.Overheads
	if delay := p.API + time.Duration(pi.tokens)*p.APIPerPromptToken - time.Since(arrival); delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-inc.quit:
			t.Stop()
			dropConn(ctx)
			return
		}
	}

	// vLLM checks its queue bound where the engine core adds the request,
	// after the frontend's work: so does the simulator.
	f = r.faults.Load()
	r.mu.Lock()
	if r.queueFullLocked(f) {
		r.mu.Unlock()
		writeTooManyRequests(ctx, f, queueFullMessage(f.MaxWaitingQueueLength))
		return
	}
	r.nextID++
	s.id = r.nextID
	s.salt = r.rng.Uint64()
	textSeed := s.salt
	if req.Seed != nil {
		textSeed = mix64(uint64(*req.Seed), 0x5eed)
	}
	q.gen0 = newTextGen(r.vocab, len(r.words), textSeed, pi.end)
	q.gen = q.gen0
	q.tokenIDs, q.promptIDs = req.ReturnTokenIDs, pi.ids
	s.target = maxTokens
	if !req.IgnoreEOS {
		s.target = min(maxTokens, max(req.MinTokens, drawLength(r.rng, r.cfg.Profile.Model.OutputLen)))
	}
	reqID := string(ctx.Request.Header.Peek("X-Request-Id"))
	if reqID == "" {
		reqID = fmt.Sprintf("%016x%016x", s.salt, s.id)
	}
	if chat {
		q.id = "chatcmpl-" + reqID
	} else {
		q.id = "cmpl-" + reqID
	}
	if kv != nil && kv.produce {
		kv.reqID = kvRequestID(q.id, s.salt)
	}
	r.eng.add(s, time.Now())
	r.mu.Unlock()
	r.kick()
	r.inflight.Add(1)
	r.watch(q)
	q.idJSON, _ = json.Marshal(q.id) // the header may hold anything

	if req.Stream {
		ctx.SetContentType("text/event-stream; charset=utf-8")
		ctx.Response.Header.Set("cache-control", "no-cache")
		ctx.Response.ImmediateHeaderFlush = true
		ctx.SetBodyStream(q, -1) // q.CloseWithError releases everything
		return
	}
	defer r.inflight.Add(-1)
	defer r.unwatch(q)
	for {
		_, total, reason := q.snapshot()
		if reason == reasonAbort {
			dropConn(ctx)
			return
		}
		if reason == reasonError {
			writeError(ctx, fasthttp.StatusInternalServerError, "InternalServerError", kvLoadFailedMessage)
			return
		}
		if reason != reasonNone {
			q.written = total
			writeJSON(ctx, fasthttp.StatusOK, q.completion(reason))
			return
		}
		select {
		case <-q.notify:
		case <-inc.quit:
			r.abort(q)
			dropConn(ctx)
			return
		case <-r.stopped:
			dropConn(ctx)
			return
		}
	}
}

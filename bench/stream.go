package bench

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"time"

	"github.com/valyala/fasthttp"
)

// maxLine bounds one SSE line; a chunk bigger than this is a broken stream.
const maxLine = 16 << 20

// maxErrorBody bounds how much of an error response is kept.
const maxErrorBody = 2048

// send sends one request and fills rec from its stream. start is the run's
// time origin; sched and ready are when the request was due and when it
// could first go (after any concurrency wait): Lag is measured from ready.
func (g *generator) send(ctx context.Context, r *Request, rec *Record, start, sched, ready time.Time) {
	rec.UseCase, rec.Model = r.UseCase, r.Model
	rec.PromptTokens = r.PromptTokens
	rec.MaxTokens = r.OutputTokens
	rec.Scheduled = sched.Sub(start)
	rec.ClientQueue = ready.Sub(sched)

	prompt := r.Prompt
	switch {
	case prompt != "":
	case r.PromptBlocks != nil:
		prompt = blockPrompt(g.cfg.Estimator, r.PromptBlocks, r.PromptTokens, r.PromptSeed)
	default:
		prompt = g.cfg.Estimator.Synthesize(r.PromptTokens, r.PromptSeed)
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	t := g.targets[rec.Index%len(g.targets)]
	req.SetRequestURI(t.url)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("X-Request-Id", rec.ID)
	for k, v := range g.cfg.Headers {
		req.Header.Set(k, v)
	}
	model := g.cfg.Model
	if r.Model != "" {
		model = r.Model
	}
	req.SetBodyRaw(appendRequestBody(make([]byte, 0, len(prompt)+256), g.chat, model, prompt, r.OutputTokens, g.cfg.IgnoreEOS))
	if g.cfg.Timeout > 0 {
		req.SetTimeout(g.cfg.Timeout)
	}

	sent := g.clock.Now()
	rec.Sent = sent.Sub(start)
	rec.Lag = sent.Sub(ready)
	g.enter()
	defer g.leave()
	defer func() { rec.End = g.clock.Now().Sub(start) }()

	if err := t.hc.Do(req, resp); err != nil {
		g.fail(ctx, rec, err)
		return
	}
	rec.Status = resp.StatusCode()
	if rec.Status != fasthttp.StatusOK {
		rec.Reason = ReasonHTTP(rec.Status)
		rec.Error = string(readErrorBody(resp))
		resp.CloseBodyStream()
		return
	}
	body := resp.BodyStream()
	if body == nil {
		// Not streamed (a small body fasthttp read whole): still parse it.
		g.readStream(ctx, rec, sent, &bytesReader{b: resp.Body()})
		return
	}
	g.readStream(ctx, rec, sent, body)
	resp.CloseBodyStream()
}

// readStream reads SSE lines until the stream ends, timestamping each chunk
// that carries output.
func (g *generator) readStream(ctx context.Context, rec *Record, sent time.Time, body io.Reader) {
	bp := g.bufs.Get().(*[]byte)
	lr := newLineReader(body, *bp, maxLine)
	defer func() {
		if cap(lr.buf) <= 64<<10 {
			*bp = lr.buf
			g.bufs.Put(bp)
		}
	}()
	rec.ITLs = make([]time.Duration, 0, min(rec.MaxTokens, 4096))
	var last time.Time
	done, failed := false, false
	for {
		line, err := lr.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			g.fail(ctx, rec, err)
			return
		}
		if done || failed {
			continue // drain to the end so the connection can be reused
		}
		c := parseSSELine(line, g.cfg.CountEmptyChunks)
		switch c.kind {
		case chunkToken:
			now := g.clock.Now()
			if rec.Chunks == 0 {
				rec.TTFT = now.Sub(sent)
			} else {
				rec.ITLs = append(rec.ITLs, now.Sub(last))
			}
			last = now
			rec.Chunks++
		case chunkDone:
			done = true
		case chunkError:
			failed = true
			rec.Reason = ReasonStreamError
			rec.Error = string(line[:min(len(line), maxErrorBody)])
		}
		if c.completionTokens >= 0 {
			rec.OutputTokens = c.completionTokens
			rec.UsageReported = true
		}
		if c.promptTokens >= 0 {
			rec.PromptTokens = c.promptTokens
		}
	}
	if rec.Chunks > 0 {
		rec.E2E = last.Sub(sent)
	}
	if !rec.UsageReported {
		rec.OutputTokens = rec.Chunks
	}
	switch {
	case failed:
	case !done:
		rec.Reason = ReasonBrokenStream
		rec.Error = "stream ended without data: [DONE]"
	case rec.Chunks == 0:
		rec.Reason = ReasonNoContent
		rec.Error = "no chunk carried output"
	}
}

// fail classifies a transport error.
func (g *generator) fail(ctx context.Context, rec *Record, err error) {
	var de *DialError
	var ne net.Error
	switch {
	case ctx.Err() != nil:
		rec.Reason = ReasonCanceled
	case errors.As(err, &de):
		rec.Reason = ReasonConnect
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		rec.Reason = ReasonTimeout
	case rec.Status == fasthttp.StatusOK:
		rec.Reason = ReasonBrokenStream
	default:
		rec.Reason = ReasonTransport
	}
	rec.Error = err.Error()
}

func (g *generator) enter() {
	n := g.inFlight.Add(1)
	for {
		m := g.maxInFlight.Load()
		if n <= m || g.maxInFlight.CompareAndSwap(m, n) {
			return
		}
	}
}

func (g *generator) leave() { g.inFlight.Add(-1) }

func readErrorBody(resp *fasthttp.Response) []byte {
	if s := resp.BodyStream(); s != nil {
		b, _ := io.ReadAll(io.LimitReader(s, maxErrorBody))
		return b
	}
	b := resp.Body()
	return b[:min(len(b), maxErrorBody)]
}

// bytesReader is a minimal io.Reader over a byte slice.
type bytesReader struct{ b []byte }

func (r *bytesReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

package proxy

import (
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/fasthttp"
)

// Stream migration: when a replica dies under a stream after its first
// byte reached the client, the generation goes on on another replica and
// the client's stream with it — same id, same chunk shape, no text lost or
// repeated, one usage chunk with the true totals at the end. While
// relaying, a stream that may be continued keeps what a continuation needs
// (migrate_track.go): the text generated so far and, where the engine
// returns them (vLLM 0.10.2+'s return_token_ids, which the router asks for
// and hides again), its token ids. On a failure it builds the continuation
// (migrate_body.go) and switches the relay to it (migrate_resume.go).

// Migration is how a pool's streams survive their replica. The zero value
// is off.
type Migration struct {
	// Max is how many times one request may be continued on another
	// replica; 0 means never (a failure mid-stream ends it with an error
	// event, as without migration).
	Max int
	// MaxSeqLen bounds what is tracked, in tokens (prompt and output): a
	// longer stream is not continued. 0 means DefaultMigrationMaxSeqLen.
	MaxSeqLen int
	// DrainGrace is how long a stream may go on on a replica that is
	// draining or was removed from its pool before it is moved to another
	// one; 0 means it is never moved (it finishes where it is).
	DrainGrace time.Duration
	// NoTokenIDs stops the router asking the engine for token ids
	// (return_token_ids): for engines that reject unknown fields. Streams
	// are then continued from their text, and token counts before the
	// switch are counted one per chunk.
	NoTokenIDs bool
}

// Defaults of the file schema (cmd/gpurouter) for a pool's migration.
const (
	// DefaultMigrationMax: one continuation covers the common failure (a
	// replica dies or is drained under its streams) at the price of one
	// re-prefill, while a request that is itself what kills engines (a
	// query of death) can take down at most two replicas, not the pool.
	DefaultMigrationMax = 1
	// DefaultMigrationMaxSeqLen bounds the memory a stream keeps: about
	// 14 bytes a token (text and ids), 450 KiB at this length.
	DefaultMigrationMaxSeqLen = 32768
	// DefaultDrainGrace: below Kubernetes' default termination grace
	// (30 s), so streams leave a terminating pod before it is killed.
	DefaultDrainGrace = 20 * time.Second
)

// Why a stream could not be continued (the error event says the cause; the
// log says these).
var (
	errLeaving       = errors.New("replica drained or removed past its grace period")
	errToolCall      = errors.New("a tool call was streaming")
	errReasoning     = errors.New("reasoning text was streaming")
	errTooLong       = errors.New("stream longer than migration max_seq_len")
	errNoIDs         = errors.New("token-id prompt and no token ids from the engine")
	errMigrationUsed = errors.New("migration limit reached")
)

// migration is one stream's continuation state, behind exchange.mig: nil
// when the request may not be continued. Written by the relay's goroutine
// only, apart from mu.
type migration struct {
	pol  Migration
	left int                  // continuations still allowed
	body []byte               // the request body as first sent upstream
	ctx  *fasthttp.RequestCtx // the client's request: headers and connection for a continuation
	// client is the client's connection a continuation's wait watches
	// when ctx's is not it (a request loop's stream: reqloop_stream_linux.go);
	// nil: ctx's.
	client  net.Conn
	chat    bool
	prefill bool  // the client's last message is a partial assistant one (continue_final_message): it grows
	strip   bool  // the router asked for token ids: they are removed from what the client sees
	off     error // why the stream can no longer be continued; nil while it can

	buf *migBuffers // pooled: text, ids, prompt ids, id, created

	tokens    int            // output tokens so far: ids counted while idsOK, else text chunks
	idsOK     bool           // every chunk with output carried its token ids
	idsSeen   bool           // some chunk carried token ids
	promptN   int            // prompt tokens, from prompt_token_ids (0 until known)
	promptEst int            // the router's estimate of them, until they are known
	finished  bool           // a chunk carried a finish_reason: only the end was lost
	choices   openai.KeyHint // where the stream's events have their choices (sse.go)

	// The switch.
	cont       bool      // relaying a continuation: ids restored, the role chunk dropped
	contFirst  bool      // no output from the current continuation yet
	before     int       // output tokens of the replicas before the current one
	lostAt     time.Time // the client's last output before the switch
	stall      time.Duration
	migrations int
	tried      []*balancer.Replica // the replicas the stream ran on, in order

	// Draining or removal of the current replica (migrate_resume.go).
	leavingSince, checkedAt time.Time

	// mu orders the relay's body swap with abort, which closes the body
	// from the client watch's goroutine.
	mu         sync.Mutex
	bodyClosed bool // abort closed the current body
}

// migBuffers are a stream's growing buffers, reused across requests.
type migBuffers struct {
	text      []byte // generated text, JSON-escaped as the engine sent it
	ids       []byte // generated token ids, comma-separated
	promptIDs []byte // the prompt's token ids, comma-separated
	id        []byte // the stream's "id" value as the client saw it (quoted)
	created   []byte // its "created" value
	body      []byte // the request body with return_token_ids added
	scratch   []byte // a continuation's usage chunk, rewritten
}

// Small at first (a stream holds them while it waits): they grow with the
// text and ids as they come.
var migBufPool = sync.Pool{New: func() any { return &migBuffers{text: make([]byte, 0, 256), ids: make([]byte, 0, 128)} }}

// maxPooledBuf is the most a buffer may hold and still be reused: one
// very long stream must not pin its memory in the pool.
const maxPooledBuf = 256 << 10

func (b *migBuffers) reset() {
	b.text, b.ids, b.promptIDs, b.id, b.created, b.body, b.scratch = b.text[:0], b.ids[:0], b.promptIDs[:0], b.id[:0], b.created[:0], b.body[:0], b.scratch[:0]
}

// startMigration returns body as it must go upstream when the request's
// stream may be continued elsewhere — asking for token ids — and sets
// x.mig; body unchanged otherwise.
func (s *Server) startMigration(ctx *fasthttp.RequestCtx, x *exchange, body []byte) []byte {
	pol := x.route.Migration
	if pol.Max <= 0 || !x.req.Stream || x.req.Cont&openai.ContNo != 0 || (x.ep != openai.Chat && x.ep != openai.Completions) ||
		(x.req.Cont&openai.ContPromptIDs != 0 && pol.NoTokenIDs) { // token ids in, and none will come back
		return body
	}
	if pol.MaxSeqLen <= 0 {
		pol.MaxSeqLen = DefaultMigrationMaxSeqLen
	}
	m := &migration{pol: pol, left: pol.Max, ctx: ctx, chat: x.ep == openai.Chat, prefill: x.req.Cont&openai.ContFinal != 0,
		idsOK: true, promptEst: x.cost.PromptTokens}
	m.buf = migBufPool.Get().(*migBuffers)
	m.buf.reset()
	if !pol.NoTokenIDs && x.req.Cont&openai.ContClientIDs == 0 {
		if b, ok := withTokenIDs(m.buf.body[:0], body); ok {
			m.buf.body, body, m.strip = b, b, true
		}
	}
	m.body = body
	x.mig = m
	return body
}

// withTokenIDs appends body with "return_token_ids":true added as its first
// key to dst (a pooled buffer: no allocation once it has grown). vLLM
// 0.10.2+ then returns the prompt's token ids in the first chunk and each
// chunk's in its choice; older versions ignore the key. false when body is
// not an object.
func withTokenIDs(dst, body []byte) ([]byte, bool) {
	return openai.WithFirstMember(dst, body, `"return_token_ids":true`)
}

// release hands the buffers back; the migration must not be used after.
func (m *migration) release() {
	b := m.buf
	if b == nil {
		return
	}
	m.buf = nil
	if cap(b.text) <= maxPooledBuf && cap(b.ids) <= maxPooledBuf && cap(b.promptIDs) <= maxPooledBuf && cap(b.body) <= maxPooledBuf {
		migBufPool.Put(b)
	}
}

// stop ends tracking: the stream can't be continued from now on.
func (m *migration) stop(why error) {
	if m.off == nil {
		m.off = why
	}
}

// chain is the replicas the stream ran on, in order ("r0>r1").
func (m *migration) chain() string {
	names := make([]string, len(m.tried))
	for i, r := range m.tried {
		names[i] = r.Name()
	}
	return strings.Join(names, ">")
}

// migrated is outcomeMigrated for a stream served to its end after a
// switch, o otherwise.
func (m *migration) outcome(o outcome) outcome {
	if m != nil && m.migrations > 0 && o == outcomeOK {
		return outcomeMigrated
	}
	return o
}

package proxy

import (
	"strconv"
	"strings"
	"time"

	"github.com/gpurouter/gpurouter/internal/openai"
)

// What a stream that may be continued keeps of each event, and how a
// continuation's events are made to look like the original stream's. All
// of it works in the relay's buffers: nothing is allocated per event.

const (
	keyReasoningContent = `"reasoning_content":`
	keyReasoningOnly    = `"reasoning":`
)

// tracked relays one choices or usage event of a stream that may be
// continued, in place of process's own handling: it records the token's
// timing and the usage as process does, keeps what a continuation needs,
// and appends the event to r.out as the client must see it.
func (r *relay) tracked(ev, payload []byte, kind openai.EventKind, now time.Time) {
	x := r.x
	m := x.mig
	if kind == openai.EventUsageOnly {
		if m.migrations > 0 {
			ev = m.fixUsage(m.buf.scratch[:0], ev, x)
			m.buf.scratch = ev[:0]
		} else {
			r.takeUsage(payload)
		}
		if !r.strip {
			r.out = append(r.out, ev...)
		}
		return
	}
	out, keep := m.token(r.out, ev)
	if !keep {
		return
	}
	r.out = out
	if kind == openai.EventToken {
		if m.contFirst {
			// The continuation's first output: the client's stall ends,
			// and the new replica's prefill is over.
			m.contFirst = false
			stall := now.Sub(m.lostAt)
			m.stall = max(m.stall, stall)
			x.s.m.mig.stall.WithLabelValues(x.route.Pool.Model()).Observe(stall.Seconds())
			x.lease.Progress(x.prefillWork())
			x.lease.PrefillDone()
		}
		x.tokenChunk(now)
	}
	if m.migrations == 0 {
		r.takeUsage(payload)
	}
}

// token keeps what a continuation needs from one token event and appends
// the event as the client must see it to dst; keep is false for an event
// the client must not see (a continuation's chat role chunk).
func (m *migration) token(dst, ev []byte) (out []byte, keep bool) {
	var es openai.Edits
	// The choice's fields in vLLM's order — text, finish_reason,
	// token_ids — each searched from where the one before ended, so the
	// event is scanned about once; the prompt's ids only until output
	// came (they ride on the first chunk).
	at := max(m.choices.Index(ev, openai.ChoicesKey), 0)
	var text []byte
	hasText := false
	key := openai.KeyText
	if m.chat {
		key = openai.KeyContent
	}
	if c, ok := openai.FieldFrom(ev, at, key); ok {
		text, hasText = c.IsString(ev)
		at = c.End
	}
	fin, hasFin := openai.FieldFrom(ev, at, openai.KeyFinishReason)
	if hasFin {
		at = fin.End
	}
	var ids openai.Span
	hasIDs := false
	if m.idsOK || m.idsSeen || m.contFirst {
		// Not once output came without them (and none ever had them):
		// the engine does not return token ids, asked or not, so the
		// rest of the stream is not searched twice an event for them.
		// A continuation's engine may differ (a fleet mid-upgrade): its
		// first output says again.
		if ids, hasIDs = openai.FieldFrom(ev, at, openai.KeyTokenIDs); !hasIDs {
			ids, hasIDs = openai.Field(ev, openai.KeyTokenIDs) // another engine's order
		}
		m.idsSeen = m.idsSeen || hasIDs
	}
	var pids openai.Span
	hasPIDs := false
	if m.tokens == 0 || m.contFirst {
		pids, hasPIDs = openai.Field(ev, openai.KeyPromptTokenIDs)
	}
	if m.strip {
		// The router asked for them: the client sees the chunk it would
		// have without.
		if hasIDs {
			w := ids.WithComma(ev)
			es.Add(w.At, w.End, nil)
		}
		if hasPIDs {
			w := pids.WithComma(ev)
			es.Add(w.At, w.End, nil)
		}
	}
	if m.chat && m.cont && len(text) == 0 && strings.Contains(openai.BytesView(ev), openai.KeyRole) {
		return dst, false // the client had its role chunk from the first replica
	}
	b := m.buf
	if m.off == nil {
		m.track(ev, text, hasText, ids, hasIDs, pids, hasPIDs)
		if hasFin && !fin.IsNull(ev) {
			m.finished = true
		}
	}
	if m.cont {
		// The continuation's own id and time: the client keeps seeing
		// the first replica's.
		if sp, ok := openai.Field(ev, openai.KeyID); ok && len(b.id) > 0 {
			es.Add(sp.At, sp.End, b.id)
		}
		if sp, ok := openai.Field(ev, openai.KeyCreated); ok && len(b.created) > 0 {
			es.Add(sp.At, sp.End, b.created)
		}
	} else if len(b.id) == 0 {
		if sp, ok := openai.Field(ev, openai.KeyID); ok {
			b.id = append(b.id, ev[sp.At:sp.End]...)
		}
		if sp, ok := openai.Field(ev, openai.KeyCreated); ok {
			b.created = append(b.created, ev[sp.At:sp.End]...)
		}
	}
	if es.N == 0 {
		return append(dst, ev...), true
	}
	return es.Apply(dst, ev), true
}

// track records one event's output: its text, its token ids, the prompt's
// ids (first chunk), whether it finished; and stops tracking what can't be
// continued.
func (m *migration) track(ev, text []byte, hasText bool, ids openai.Span, hasIDs bool, pids openai.Span, hasPIDs bool) {
	b := m.buf
	if m.chat && !hasText {
		// A delta without text: a tool call or reasoning, neither of
		// which can be put back into an assistant message.
		if tc, ok := openai.Field(ev, openai.KeyToolCalls); ok && ev[tc.At] == '[' && tc.End-tc.At > 2 {
			m.stop(errToolCall)
			return
		}
		for _, k := range [...]string{keyReasoningContent, keyReasoningOnly} {
			if rc, ok := openai.Field(ev, k); ok {
				if s, isStr := rc.IsString(ev); isStr && len(s) > 0 {
					m.stop(errReasoning)
					return
				}
			}
		}
	}
	if hasPIDs && m.promptN == 0 && !m.cont {
		if inner, n, ok := pids.IDList(ev); ok && n > 0 {
			b.promptIDs = append(b.promptIDs[:0], inner...)
			m.promptN = n
		}
	}
	b.text = append(b.text, text...)
	switch {
	case hasIDs:
		inner, n, ok := ids.IDList(ev)
		if !ok {
			m.idsOK = false
			if len(text) > 0 {
				m.tokens++
			}
			break
		}
		if n > 0 {
			if len(b.ids) > 0 {
				b.ids = append(b.ids, ',')
			}
			b.ids = append(b.ids, inner...)
		}
		m.tokens += n
	case len(text) > 0:
		m.idsOK = false // one chunk stands for one token from now on
		m.tokens++
	}
	prompt := m.promptN
	if prompt == 0 {
		prompt = m.promptEst
	}
	if prompt+m.tokens > m.pol.MaxSeqLen {
		m.stop(errTooLong)
	}
}

// fixUsage is the usage chunk of a continued stream as the client must see
// it, appended to dst: the original prompt (its ids counted, else the
// continuation's prompt less the output it carried) and the output of
// every replica; the exchange records the same.
func (m *migration) fixUsage(dst, ev []byte, x *exchange) []byte {
	p, c, ok := openai.ReadUsage(openai.EventData(ev))
	if !ok {
		return append(dst, ev...)
	}
	prompt := m.promptN
	if prompt == 0 {
		prompt = max(p-m.before, 0)
	}
	completion := m.before + c
	x.promptTokens, x.completionTokens, x.gotUsage = int32(prompt), int32(completion), true
	var es openai.Edits
	var num [96]byte
	if sp, ok := openai.Field(ev, openai.KeyUsage); ok {
		es.Add(sp.At, sp.End, appendUsageJSON(num[:0], prompt, completion))
	}
	if sp, ok := openai.Field(ev, openai.KeyID); ok && len(m.buf.id) > 0 {
		es.Add(sp.At, sp.End, m.buf.id)
	}
	if sp, ok := openai.Field(ev, openai.KeyCreated); ok && len(m.buf.created) > 0 {
		es.Add(sp.At, sp.End, m.buf.created)
	}
	return es.Apply(dst, ev)
}

// appendUsageJSON appends a usage object in vLLM's key order.
func appendUsageJSON(dst []byte, prompt, completion int) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt+completion), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(completion), 10)
	return append(dst, '}')
}

package proxy

import (
	"bytes"
	"strconv"
	"time"
)

// What a stream that may be continued keeps of each event, and how a
// continuation's events are made to look like the original stream's. All
// of it works in the relay's buffers: nothing is allocated per event.

var (
	keyReasoningContent = []byte(`"reasoning_content":`)
	keyReasoningOnly    = []byte(`"reasoning":`)
)

// tracked relays one choices or usage event of a stream that may be
// continued, in place of process's own handling: it records the token's
// timing and the usage as process does, keeps what a continuation needs,
// and appends the event to r.out as the client must see it.
func (r *relay) tracked(ev, payload []byte, kind eventKind, now time.Time) {
	x := r.x
	m := x.mig
	if kind == evUsageOnly {
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
	if kind == evToken {
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
	var es edits
	// The choice's fields in vLLM's order — text, finish_reason,
	// token_ids — each searched from where the one before ended, so the
	// event is scanned about once; the prompt's ids only until output
	// came (they ride on the first chunk).
	at := max(m.choices.index(ev, choicesKey), 0)
	var text []byte
	hasText := false
	key := keyText
	if m.chat {
		key = keyContent
	}
	if c, ok := fieldFrom(ev, at, key); ok {
		text, hasText = c.isString(ev)
		at = c.end
	}
	fin, hasFin := fieldFrom(ev, at, keyFinishReason)
	if hasFin {
		at = fin.end
	}
	var ids span
	hasIDs := false
	if m.idsOK || m.idsSeen || m.contFirst {
		// Not once output came without them (and none ever had them):
		// the engine does not return token ids, asked or not, so the
		// rest of the stream is not searched twice an event for them.
		// A continuation's engine may differ (a fleet mid-upgrade): its
		// first output says again.
		if ids, hasIDs = fieldFrom(ev, at, keyTokenIDs); !hasIDs {
			ids, hasIDs = field(ev, keyTokenIDs) // another engine's order
		}
		m.idsSeen = m.idsSeen || hasIDs
	}
	var pids span
	hasPIDs := false
	if m.tokens == 0 || m.contFirst {
		pids, hasPIDs = field(ev, keyPromptTokenIDs)
	}
	if m.strip {
		// The router asked for them: the client sees the chunk it would
		// have without.
		if hasIDs {
			w := ids.withComma(ev)
			es.add(w.at, w.end, nil)
		}
		if hasPIDs {
			w := pids.withComma(ev)
			es.add(w.at, w.end, nil)
		}
	}
	if m.chat && m.cont && len(text) == 0 && bytes.Contains(ev, keyRole) {
		return dst, false // the client had its role chunk from the first replica
	}
	b := m.buf
	if m.off == nil {
		m.track(ev, text, hasText, ids, hasIDs, pids, hasPIDs)
		if hasFin && !fin.isNull(ev) {
			m.finished = true
		}
	}
	if m.cont {
		// The continuation's own id and time: the client keeps seeing
		// the first replica's.
		if sp, ok := field(ev, keyID); ok && len(b.id) > 0 {
			es.add(sp.at, sp.end, b.id)
		}
		if sp, ok := field(ev, keyCreated); ok && len(b.created) > 0 {
			es.add(sp.at, sp.end, b.created)
		}
	} else if len(b.id) == 0 {
		if sp, ok := field(ev, keyID); ok {
			b.id = append(b.id, ev[sp.at:sp.end]...)
		}
		if sp, ok := field(ev, keyCreated); ok {
			b.created = append(b.created, ev[sp.at:sp.end]...)
		}
	}
	if es.n == 0 {
		return append(dst, ev...), true
	}
	return es.apply(dst, ev), true
}

// track records one event's output: its text, its token ids, the prompt's
// ids (first chunk), whether it finished; and stops tracking what can't be
// continued.
func (m *migration) track(ev, text []byte, hasText bool, ids span, hasIDs bool, pids span, hasPIDs bool) {
	b := m.buf
	if m.chat && !hasText {
		// A delta without text: a tool call or reasoning, neither of
		// which can be put back into an assistant message.
		if tc, ok := field(ev, keyToolCalls); ok && ev[tc.at] == '[' && tc.end-tc.at > 2 {
			m.stop(errToolCall)
			return
		}
		for _, k := range [...][]byte{keyReasoningContent, keyReasoningOnly} {
			if rc, ok := field(ev, k); ok {
				if s, isStr := rc.isString(ev); isStr && len(s) > 0 {
					m.stop(errReasoning)
					return
				}
			}
		}
	}
	if hasPIDs && m.promptN == 0 && !m.cont {
		if inner, n, ok := pids.idList(ev); ok && n > 0 {
			b.promptIDs = append(b.promptIDs[:0], inner...)
			m.promptN = n
		}
	}
	b.text = append(b.text, text...)
	switch {
	case hasIDs:
		inner, n, ok := ids.idList(ev)
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
	p, c, ok := readUsage(eventData(ev))
	if !ok {
		return append(dst, ev...)
	}
	prompt := m.promptN
	if prompt == 0 {
		prompt = max(p-m.before, 0)
	}
	completion := m.before + c
	x.promptTokens, x.completionTokens, x.gotUsage = prompt, completion, true
	var es edits
	var num [96]byte
	if sp, ok := field(ev, keyUsage); ok {
		es.add(sp.at, sp.end, appendUsageJSON(num[:0], prompt, completion))
	}
	if sp, ok := field(ev, keyID); ok && len(m.buf.id) > 0 {
		es.add(sp.at, sp.end, m.buf.id)
	}
	if sp, ok := field(ev, keyCreated); ok && len(m.buf.created) > 0 {
		es.add(sp.at, sp.end, m.buf.created)
	}
	return es.apply(dst, ev)
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

package openai

import (
	"bytes"
	"strings"

	"github.com/tidwall/gjson"
)

// EventKind classifies one SSE event of an OpenAI-style stream.
type EventKind uint8

const (
	EventOther     EventKind = iota // comments, keep-alives, unknown shapes: relayed as is
	EventToken                      // a chunk whose choices carry output (text, reasoning, a tool call): counts for TTFT/ITL
	EventChoice                     // a chunk whose choices carry none: a chat stream's role-only first chunk, a last one with its finish_reason alone
	EventUsageOnly                  // choices empty, usage present: the final usage chunk
	EventDone                       // data: [DONE]
	EventError                      // data: {"error": ...}
)

// What the classification looks for in an event, as engines write it.
const (
	dataPrefix   = "data:"
	DonePayload  = "[DONE]"
	ChoicesKey   = `"choices":`
	UsageKey     = `"usage":`
	errorPrefix  = `{"error"`
	objectPrefix = `{"object":"error"`
)

// NextEvent finds the first complete event in buf (terminated by a blank
// line) and returns its length including the terminator, or -1 when buf
// holds no complete event yet. Both \n\n and \r\n\r\n are accepted.
func NextEvent(buf []byte) int {
	for i := 0; i < len(buf); {
		j := bytes.IndexByte(buf[i:], '\n')
		if j < 0 {
			return -1
		}
		j += i
		if line := buf[i:j]; len(line) == 0 || (len(line) == 1 && line[0] == '\r') {
			return j + 1
		}
		i = j + 1
	}
	return -1
}

// EventData returns the payload of the event's first data: line, trimmed.
func EventData(ev []byte) []byte {
	for len(ev) > 0 {
		line := ev
		if k := bytes.IndexByte(ev, '\n'); k >= 0 {
			line, ev = ev[:k], ev[k+1:]
		} else {
			ev = nil
		}
		if strings.HasPrefix(BytesView(line), dataPrefix) {
			return bytes.TrimSpace(line[len(dataPrefix):])
		}
	}
	return nil
}

// ChunkHints are where a stream's previous chunk had its choices and its
// output (KeyHint, outputHint): an engine writes every chunk of a stream
// alike, so each is found with a comparison or two.
type ChunkHints struct {
	choices KeyHint
	output  outputHint
}

// ClassifyEvent says what an event is without decoding its JSON: streams
// carry thousands of events per second and only the usage chunk needs a
// real parse. hints are the stream's (nil: none kept).
func ClassifyEvent(payload []byte, hints *ChunkHints) EventKind {
	switch {
	case len(payload) == 0:
		return EventOther
	case string(payload) == DonePayload:
		return EventDone
	case strings.HasPrefix(BytesView(payload), errorPrefix) || strings.HasPrefix(BytesView(payload), objectPrefix):
		return EventError
	}
	var choices *KeyHint
	var output *outputHint
	if hints != nil {
		choices, output = &hints.choices, &hints.output
	}
	i := choices.Index(payload, ChoicesKey)
	if i < 0 {
		if IndexKey(payload, UsageKey) >= 0 {
			return EventUsageOnly
		}
		return EventOther
	}
	rest := trimSpace(payload[i+len(ChoicesKey):])
	if len(rest) == 0 || rest[0] != '[' {
		return EventOther
	}
	rest = trimSpace(rest[1:])
	if len(rest) > 0 && rest[0] == ']' {
		if hasUsage(payload) {
			return EventUsageOnly
		}
		return EventOther
	}
	if carriesOutput(payload, i, output) {
		return EventToken
	}
	return EventChoice
}

// The members of a choice that carry output, as outputMember names them: a
// chat delta's content, reasoning and tool calls, a completion's text.
// The router's TTFT is a stream's first chunk that has one, as vLLM's
// benchmark counts it: vLLM's first chat chunk often carries the role
// alone, tens of milliseconds before the first token.
const (
	outContent = iota
	outText
	outReasoningContent
	outReasoning
	outToolCalls
	outputMembers
)

// outputMember is the key of output member k, from its opening quote.
func outputMember(k int) string {
	switch k {
	case outContent:
		return `"content":`
	case outText:
		return `"text":`
	case outReasoningContent:
		return `"reasoning_content":`
	case outReasoning:
		return `"reasoning":`
	}
	return `"tool_calls":`
}

// outputHint is where a stream's last chunk with output had it: the
// offset of the member's key, plus one (0: none yet), and which it was.
type outputHint struct {
	at  uint32
	key uint8
}

// carriesOutput reports whether a chunk's choices, which start at from in
// payload, carry output: a non-empty string under a text member, or a
// non-empty tool_calls array. Mostly one comparison: where the stream's
// last chunk had its output (h; nil: none kept), else a search of each
// key, each of its places (logprobs have a "content" array of their own).
func carriesOutput(payload []byte, from int, h *outputHint) bool {
	if h != nil && h.at > 0 {
		k := outputMember(int(h.key))
		if at := int(h.at) - 1; at+len(k) <= len(payload) && string(payload[at:at+len(k)]) == k && isOutput(payload[at+len(k):], int(h.key)) {
			return true
		}
	}
	for key := range outputMembers {
		k := outputMember(key)
		for i := from; i < len(payload); {
			j := IndexKey(payload[i:], k)
			if j < 0 {
				break
			}
			at := i + j
			if isOutput(payload[at+len(k):], key) {
				if h != nil {
					*h = outputHint{at: uint32(at + 1), key: uint8(key)}
				}
				return true
			}
			i = at + len(k)
		}
	}
	return false
}

// isOutput reports whether v, the value after output member key's colon,
// carries output: a string other than "", or for tool calls an array
// other than [].
func isOutput(v []byte, key int) bool {
	v = trimSpace(v)
	if len(v) < 2 {
		return false
	}
	if key == outToolCalls {
		items := trimSpace(v[1:])
		return v[0] == '[' && len(items) > 0 && items[0] != ']'
	}
	return v[0] == '"' && v[1] != '"'
}

// hasUsage reports a non-null "usage" object in the chunk.
func hasUsage(payload []byte) bool {
	i := IndexKey(payload, UsageKey)
	if i < 0 {
		return false
	}
	rest := trimSpace(payload[i+len(UsageKey):])
	return len(rest) > 0 && rest[0] == '{'
}

// ReadUsage extracts prompt and completion token counts from a chunk or a
// whole response body; ok is false when it carries no usage.
func ReadUsage(payload []byte) (prompt, completion int, ok bool) {
	if !hasUsage(payload) {
		return 0, 0, false
	}
	// A view, not a copy: only numbers are taken from it.
	u := gjson.Get(BytesView(payload), "usage")
	if !u.IsObject() {
		return 0, 0, false
	}
	return int(u.Get("prompt_tokens").Int()), int(u.Get("completion_tokens").Int()), true
}

// KeyHint is where a key sat in a stream's previous chunk, plus one; the
// zero value (and a nil *KeyHint) holds none. An engine writes a stream's
// chunks with the same fields in the same order, so the next chunk mostly
// has the key at the same offset, and one comparison replaces a search
// that stops at every quote before it — the largest part of the relay's
// per-event parse. Only for a key whose every occurrence is the one
// wanted: a JSON string can't hold `"key":` (its quotes are escaped), so
// the pattern at the hinted offset is that key; choices is the first
// object of a chunk, so nothing before it holds another.
type KeyHint uint32

// Index returns key's offset in b: the hinted one when b has key there,
// else the first (which becomes the hint), or -1.
func (h *KeyHint) Index(b []byte, key string) int {
	if h == nil {
		return strings.Index(BytesView(b), key)
	}
	if at := int(*h) - 1; at >= 0 && at+len(key) <= len(b) && string(b[at:at+len(key)]) == key {
		return at
	}
	i := strings.Index(BytesView(b), key)
	if i >= 0 {
		*h = KeyHint(i + 1)
	}
	return i
}

// IndexKey is bytes.Index(b, key) for a key written `"name":`, anchored
// on the name's first letter rather than on the quote, which a chunk has
// dozens of: bytes.Index stops at each quote to compare, IndexKey only
// where the letter is ("usage", absent from nearly every chunk, stops at
// the u of "chunk" and of two nulls).
func IndexKey(b []byte, key string) int {
	name := key[1:]
	for i := 1; i < len(b); i++ {
		j := bytes.IndexByte(b[i:], name[0])
		if j < 0 {
			return -1
		}
		i += j
		if b[i-1] == '"' && len(b)-i >= len(name) && string(b[i:i+len(name)]) == name {
			return i - 1
		}
	}
	return -1
}

// trimSpace is b past its leading JSON whitespace: bytes.TrimLeft with a
// cutset builds the set on every call, a tenth of an event's
// classification.
func trimSpace(b []byte) []byte { return b[skipJSONSpace(b, 0):] }

package proxy

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// eventKind classifies one SSE event of an OpenAI-style stream.
type eventKind uint8

const (
	evOther     eventKind = iota // comments, keep-alives, unknown shapes: relayed as is
	evToken                      // a chunk with non-empty choices: counts for TTFT/ITL
	evUsageOnly                  // choices empty, usage present: the final usage chunk
	evDone                       // data: [DONE]
	evError                      // data: {"error": ...}
)

var (
	dataPrefix   = []byte("data:")
	donePayload  = []byte("[DONE]")
	choicesKey   = []byte(`"choices":`)
	usageKey     = []byte(`"usage":`)
	errorPrefix  = []byte(`{"error"`)
	objectPrefix = []byte(`{"object":"error"`)
)

// nextEvent finds the first complete event in buf (terminated by a blank
// line) and returns its length including the terminator, or -1 when buf
// holds no complete event yet. Both \n\n and \r\n\r\n are accepted.
func nextEvent(buf []byte) int {
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

// eventData returns the payload of the event's first data: line, trimmed.
func eventData(ev []byte) []byte {
	for len(ev) > 0 {
		line := ev
		if k := bytes.IndexByte(ev, '\n'); k >= 0 {
			line, ev = ev[:k], ev[k+1:]
		} else {
			ev = nil
		}
		if bytes.HasPrefix(line, dataPrefix) {
			return bytes.TrimSpace(line[len(dataPrefix):])
		}
	}
	return nil
}

// classifyEvent says what an event is without decoding its JSON: streams
// carry thousands of events per second and only the usage chunk needs a
// real parse. choices is where the stream's previous chunk had its
// choices (nil: none kept).
func classifyEvent(payload []byte, choices *keyHint) eventKind {
	switch {
	case len(payload) == 0:
		return evOther
	case bytes.Equal(payload, donePayload):
		return evDone
	case bytes.HasPrefix(payload, errorPrefix) || bytes.HasPrefix(payload, objectPrefix):
		return evError
	}
	i := choices.index(payload, choicesKey)
	if i < 0 {
		if indexKey(payload, usageKey) >= 0 {
			return evUsageOnly
		}
		return evOther
	}
	rest := bytes.TrimLeft(payload[i+len(choicesKey):], " \t\r\n")
	if len(rest) == 0 || rest[0] != '[' {
		return evOther
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) > 0 && rest[0] == ']' {
		if hasUsage(payload) {
			return evUsageOnly
		}
		return evOther
	}
	return evToken
}

// hasUsage reports a non-null "usage" object in the chunk.
func hasUsage(payload []byte) bool {
	i := indexKey(payload, usageKey)
	if i < 0 {
		return false
	}
	rest := bytes.TrimLeft(payload[i+len(usageKey):], " \t\r\n")
	return len(rest) > 0 && rest[0] == '{'
}

// readUsage extracts prompt and completion token counts from a chunk or a
// whole response body; ok is false when it carries no usage.
func readUsage(payload []byte) (prompt, completion int, ok bool) {
	if !hasUsage(payload) {
		return 0, 0, false
	}
	// A view, not a copy: only numbers are taken from it.
	u := gjson.Get(bytesView(payload), "usage")
	if !u.IsObject() {
		return 0, 0, false
	}
	return int(u.Get("prompt_tokens").Int()), int(u.Get("completion_tokens").Int()), true
}

// keyHint is where a key sat in a stream's previous chunk, plus one; the
// zero value (and a nil *keyHint) holds none. An engine writes a stream's
// chunks with the same fields in the same order, so the next chunk mostly
// has the key at the same offset, and one comparison replaces a search
// that stops at every quote before it — the largest part of the relay's
// per-event parse. Only for a key whose every occurrence is the one
// wanted: a JSON string can't hold `"key":` (its quotes are escaped), so
// the pattern at the hinted offset is that key; choices is the first
// object of a chunk, so nothing before it holds another.
type keyHint uint32

// index returns key's offset in b: the hinted one when b has key there,
// else the first (which becomes the hint), or -1.
func (h *keyHint) index(b, key []byte) int {
	if h == nil {
		return bytes.Index(b, key)
	}
	if at := int(*h) - 1; at >= 0 && at+len(key) <= len(b) && bytes.Equal(b[at:at+len(key)], key) {
		return at
	}
	i := bytes.Index(b, key)
	if i >= 0 {
		*h = keyHint(i + 1)
	}
	return i
}

// indexKey is bytes.Index(b, key) for a key written `"name":`, anchored
// on the name's first letter rather than on the quote, which a chunk has
// dozens of: bytes.Index stops at each quote to compare, indexKey only
// where the letter is ("usage", absent from nearly every chunk, stops at
// the u of "chunk" and of two nulls).
func indexKey(b, key []byte) int {
	name := key[1:]
	for i := 1; i < len(b); i++ {
		j := bytes.IndexByte(b[i:], name[0])
		if j < 0 {
			return -1
		}
		i += j
		if b[i-1] == '"' && bytes.HasPrefix(b[i:], name) {
			return i - 1
		}
	}
	return -1
}

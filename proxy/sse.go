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
// real parse.
func classifyEvent(payload []byte) eventKind {
	switch {
	case len(payload) == 0:
		return evOther
	case bytes.Equal(payload, donePayload):
		return evDone
	case bytes.HasPrefix(payload, errorPrefix) || bytes.HasPrefix(payload, objectPrefix):
		return evError
	}
	i := bytes.Index(payload, choicesKey)
	if i < 0 {
		if bytes.Contains(payload, usageKey) {
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
	i := bytes.Index(payload, usageKey)
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

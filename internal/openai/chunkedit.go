package openai

import "bytes"

// Byte-level reading and editing of stream chunks for migration: a stream
// that may be continued elsewhere has every chunk looked at, so these find
// a field's value and splice the event without decoding it or allocating.
// They read the chunks engines write (vLLM's pydantic JSON, compact or with
// a space after the colon); a field they can't find reads as absent.

// Field keys, as they appear in chunks, each from its opening quote
// (IndexKey). Read-only.
const (
	KeyID             = `"id":`
	KeyCreated        = `"created":`
	KeyContent        = `"content":`
	KeyText           = `"text":`
	KeyRole           = `"role":`
	KeyTokenIDs       = `"token_ids":`
	KeyPromptTokenIDs = `"prompt_token_ids":`
	KeyFinishReason   = `"finish_reason":`
	KeyToolCalls      = `"tool_calls":`
	KeyReasoning      = `"reasoning` // reasoning_content (vLLM < 0.11), reasoning
	KeyUsage          = `"usage":`
)

// Span is a byte range [at, end) of an event; key is where its key starts
// (-1 when the span is a value alone).
type Span struct{ key, At, End int }

// Field finds key in b and returns the span of its value (whitespace
// before it skipped), with key's position; ok is false when key is absent
// or its value unreadable.
func Field(b []byte, key string) (Span, bool) { return FieldFrom(b, 0, key) }

// FieldFrom is field looking at b[from:] only (positions are b's): chunks
// hold their fields in the engine's order, so a search can start where the
// previous field ended.
func FieldFrom(b []byte, from int, key string) (Span, bool) {
	if from < 0 || from > len(b) {
		return Span{}, false
	}
	k := IndexKey(b[from:], key)
	if k < 0 {
		return Span{}, false
	}
	k += from
	i := k + len(key)
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	end := valueEnd(b, i)
	if end < 0 {
		return Span{}, false
	}
	return Span{key: k, At: i, End: end}, true
}

// valueEnd returns the end of the JSON value starting at b[i], or -1.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e := stringEnd(b, j)
				if e < 0 {
					return -1
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' && b[j] != '\r' && b[j] != '\t' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// stringEnd returns the index after the string starting at b[i] (a
// quote), or -1 when no quote ends it. A quote ends it when an even run of
// backslashes comes before it (each pair is one escaped backslash); the
// quotes are found with IndexByte's stride, not byte by byte, as a prompt
// can be long (jsonValues).
func stringEnd(b []byte, i int) int {
	for j := i + 1; ; {
		q := bytes.IndexByte(b[j:], '"')
		if q < 0 {
			return -1
		}
		q += j
		k := q - 1
		for k > i && b[k] == '\\' {
			k--
		}
		if (q-1-k)%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

// IsString reports a span holding a JSON string; inner is its escaped
// content, as it may be pasted into another JSON string.
func (s Span) IsString(b []byte) (inner []byte, ok bool) {
	if s.End-s.At < 2 || b[s.At] != '"' {
		return nil, false
	}
	return b[s.At+1 : s.End-1], true
}

// IsNull reports a span holding null.
func (s Span) IsNull(b []byte) bool { return bytes.Equal(b[s.At:s.End], []byte("null")) }

// idList returns the elements of a span holding an array of numbers
// ("1,2,3", without brackets) and their count; ok is false for anything
// else (null).
func (s Span) IDList(b []byte) (inner []byte, n int, ok bool) {
	if s.End-s.At < 2 || b[s.At] != '[' {
		return nil, 0, false
	}
	inner = bytes.TrimSpace(b[s.At+1 : s.End-1])
	if len(inner) == 0 {
		return inner, 0, true
	}
	return inner, bytes.Count(inner, []byte(",")) + 1, true
}

// WithComma widens a field's span (key included) to take one comma with
// it, so removing it leaves valid JSON: the comma before, else the one
// after.
func (s Span) WithComma(b []byte) Span {
	out := Span{key: -1, At: s.key, End: s.End}
	i := s.key - 1
	for i >= 0 && (b[i] == ' ' || b[i] == '\t') {
		i--
	}
	if i >= 0 && b[i] == ',' {
		out.At = i
		return out
	}
	j := s.End
	for j < len(b) && (b[j] == ' ' || b[j] == '\t') {
		j++
	}
	if j < len(b) && b[j] == ',' {
		out.End = j + 1
	}
	return out
}

// edit replaces a span of an event with repl (nil: removes it).
type edit struct {
	at, end int
	repl    []byte
}

// Edits is a handful of non-overlapping edits of one event; at most
// len(edits) are kept, which is all a chunk ever needs.
type Edits struct {
	e [4]edit
	N int
}

func (es *Edits) Add(at, end int, repl []byte) {
	if es.N == len(es.e) || at < 0 || end < at {
		return
	}
	es.e[es.N] = edit{at, end, repl}
	es.N++
}

// Apply appends ev with the edits made to dst. Edits overlapping an
// earlier one are dropped.
func (es *Edits) Apply(dst, ev []byte) []byte {
	e := es.e[:es.N]
	for i := 1; i < len(e); i++ { // insertion sort: a few elements
		for j := i; j > 0 && e[j].at < e[j-1].at; j-- {
			e[j], e[j-1] = e[j-1], e[j]
		}
	}
	pos := 0
	for _, x := range e {
		if x.at < pos {
			continue
		}
		dst = append(dst, ev[pos:x.at]...)
		dst = append(dst, x.repl...)
		pos = x.end
	}
	return append(dst, ev[pos:]...)
}

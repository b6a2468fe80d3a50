package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"
)

// endpoint is which OpenAI API a request is for.
type endpoint uint8

const (
	epChat endpoint = iota + 1
	epCompletions
	epEmbeddings
)

// path is the upstream path of the endpoint.
func (e endpoint) path() string {
	switch e {
	case epChat:
		return "/v1/chat/completions"
	case epCompletions:
		return "/v1/completions"
	case epEmbeddings:
		return "/v1/embeddings"
	}
	return ""
}

func (e endpoint) String() string {
	switch e {
	case epChat:
		return "chat"
	case epCompletions:
		return "completions"
	case epEmbeddings:
		return "embeddings"
	}
	return "unknown"
}

// request is what the router needs from a client request body, read in one
// pass. Strings are copies: they outlive the fasthttp body buffer.
type request struct {
	model       string // "" when the body has none
	stream      bool
	clientUsage bool         // the client asked for stream_options.include_usage itself
	hasOptions  bool         // stream_options is present and an object
	optionsKey  bool         // stream_options is present, an object or not (null)
	cont        contFlags    // what a continuation on another replica must know (migrate.go)
	maxTokens   int          // the output limit the engine applies: max_completion_tokens, else max_tokens; 0 when unset
	limits      [2]outputKey // max_tokens, max_completion_tokens as given (see outputKeys)
	promptBytes int          // bytes of prompt text (messages' content, prompt, input)
	messages    int          // chat messages
	user        string
	prefixHash  uint64 // hash of the system prompt, else of the prompt's first prefixBytes; 0 if no text
}

// outputKeys are the two names a client may limit its output by, in the
// order request.limits holds them.
var outputKeys = [2]string{"max_tokens", "max_completion_tokens"}

// outputKey is one output-limit key as the body gives it.
type outputKey struct {
	n     uint32 // its value (at most 2^31, see nonNegInt); 0 when null or absent
	given bool   // present, possibly null
	null  bool
}

// effectiveMax is the output limit the engine applies, as vLLM reads it:
// max_completion_tokens when non-zero, else max_tokens; 0 when neither.
func effectiveMax(k [2]outputKey) int {
	if k[1].n > 0 {
		return int(k[1].n)
	}
	return int(k[0].n)
}

// prefixBytes is how much of a prompt without a system message identifies
// its prefix for prefix-affinity routing: about 256 tokens.
const prefixBytes = 1024

// prefixHashOf hashes a prompt prefix (xxHash64) and never returns 0,
// which means "no prefix". Deterministic across processes so every router
// instance sends a prefix to the same replica. xxHash reads eight bytes at
// a time: a 1 KiB prefix costs ~0.1 µs, where the byte-at-a-time FNV-1a it
// replaced cost ~1 µs on every request with a long system prompt.
func prefixHashOf(s string) uint64 {
	if len(s) > prefixBytes {
		s = s[:prefixBytes]
	}
	return xxhash.Sum64String(s) | 1
}

// promptTokens estimates the prompt size in tokens from its bytes (about 4
// bytes per token in English text, OpenAI's rule of thumb). The admission
// controller refines estimates with a real tokenizer; routing only needs
// the order of magnitude.
func (r *request) promptTokens() int { return (r.promptBytes + 3) / 4 }

// bytesView returns a string sharing b's memory, so a parser can scan the
// body without copying it. The result must not outlive b or be retained:
// every string kept from it is cloned.
func bytesView(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// readRequest reads the fields the router needs from a JSON body and checks
// their types, naming the first offending field. The body is validated
// first (checkJSON: strict JSON, as gjson reads it, nested no more than
// the parser goes), its members noted as it is (checkJSONMembers); those
// the router reads are then parsed by p, one at a time, within one
// bound on the tree (memberParser, jsonscan.go); a prompt of token ids is
// read from its bytes (idArrays). The body is left as it is; what the
// request keeps is copied out of p, free for the next body once
// readRequest returns. fastjson reads a member in one pass where gjson's
// top-level walk skipped the messages, its second walk went through them
// again, and each lookup in a message scanned it anew; its parser alone is
// not a validator (it takes leading zeros, control characters and unknown
// escapes), hence the check before it. A lone surrogate escape ("\ud800"
// alone) stays as written where gjson made it U+FFFD: only the size and
// prefix hash of such a (not Unicode) string move.
func readRequest(p *fastjson.Parser, body []byte, ep endpoint) (request, error) {
	var r request
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return r, badParam("body", "empty request body; expected a JSON object")
	}
	var members objectMembers
	switch err := checkJSONMembers(trimmed, &members); {
	case errors.Is(err, errJSONDepth):
		return r, badParam("body", fmt.Sprintf("JSON nested more than %d levels deep", maxJSONDepth))
	case err != nil:
		return r, badParam("body", "malformed JSON")
	}
	if trimmed[0] != '{' {
		return r, badParam("body", "expected a JSON object")
	}
	var sawInput bool
	mp := newMemberParser(p)
	err := members.each(trimmed, func(key, raw []byte) error {
		switch k := memberKey(p, key); k {
		case "model":
			if rawType(raw) != fastjson.TypeString {
				return badParam("model", "must be a string")
			}
			v, err := mp.tree(k, raw)
			if err != nil {
				return err
			}
			r.model = string(v.GetStringBytes())
		case "stream":
			t := rawType(raw)
			if t != fastjson.TypeTrue && t != fastjson.TypeFalse && t != fastjson.TypeNull {
				return badParam("stream", "must be a boolean")
			}
			r.stream = t == fastjson.TypeTrue
		case "stream_options":
			r.optionsKey = true
			switch rawType(raw) {
			case fastjson.TypeNull:
				return nil
			case fastjson.TypeObject:
			default:
				return badParam("stream_options", "must be an object")
			}
			r.hasOptions = true
			v, err := mp.tree(k, raw)
			if err != nil {
				return err
			}
			iu := v.Get("include_usage")
			if iu != nil {
				if t := iu.Type(); t != fastjson.TypeTrue && t != fastjson.TypeFalse && t != fastjson.TypeNull {
					return badParam("stream_options.include_usage", "must be a boolean")
				}
				r.clientUsage = iu.Type() == fastjson.TypeTrue
			}
			if c := v.Get("continuous_usage_stats"); c != nil && c.Type() == fastjson.TypeTrue {
				r.cont |= contNo // per-chunk usage can't be made to add up across replicas
			}
		case "max_tokens", "max_completion_tokens":
			i := 0
			if k == outputKeys[1] {
				i = 1
			}
			// The engine reads the last of a repeated key, a rewrite (and
			// the router's cost) the first: refuse the ambiguity.
			if r.limits[i].given {
				return badParam(outputKeys[i], "given more than once")
			}
			r.limits[i].given = true
			if rawType(raw) == fastjson.TypeNull {
				r.limits[i].null = true
				return nil
			}
			n, ok := 0, false
			if rawType(raw) == fastjson.TypeNumber {
				v, err := mp.tree(outputKeys[i], raw)
				if err != nil {
					return err
				}
				n, ok = nonNegInt(v)
			}
			if !ok {
				return badParam(outputKeys[i], "must be a non-negative integer")
			}
			r.limits[i].n = uint32(n)
		case "user":
			switch rawType(raw) {
			case fastjson.TypeNull:
				r.user = ""
			case fastjson.TypeString:
				v, err := mp.tree(k, raw)
				if err != nil {
					return err
				}
				r.user = string(v.GetStringBytes())
			default:
				return badParam("user", "must be a string")
			}
		case "messages":
			if ep != epChat {
				return nil
			}
			sawInput = true
			v, err := mp.tree(k, raw)
			if err != nil {
				return err
			}
			return r.readMessages(v)
		case "prompt":
			if ep != epCompletions {
				return nil
			}
			sawInput = true
			if size, cont, ok := idArrays(raw); ok {
				r.promptBytes, r.prefixHash = size, 0
				r.cont |= cont
				return nil
			}
			v, err := mp.tree(k, raw)
			if err != nil {
				return err
			}
			if r.promptBytes, err = textSize("prompt", v); err != nil {
				return err
			}
			r.prefixHash = firstTextHash(v)
			r.cont |= promptCont(v)
		case "input":
			if ep != epEmbeddings {
				return nil
			}
			sawInput = true
			if size, _, ok := idArrays(raw); ok {
				r.promptBytes = size
				return nil
			}
			v, err := mp.tree(k, raw)
			if err != nil {
				return err
			}
			r.promptBytes, err = textSize("input", v)
			return err
		default:
			c, err := continuation(&mp, k, raw)
			r.cont |= c
			return err
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	r.maxTokens = effectiveMax(r.limits)
	if !sawInput {
		switch ep {
		case epChat:
			return r, badParam("messages", "required")
		case epCompletions:
			return r, badParam("prompt", "required")
		case epEmbeddings:
			return r, badParam("input", "required")
		}
	}
	return r, nil
}

// nonNegInt reads a non-negative integer of at most 2^31 (1e3 and 5.0
// count, as they are integers).
func nonNegInt(v *fastjson.Value) (int, bool) {
	f, err := v.Float64()
	if err != nil || f < 0 || f != float64(int64(f)) || f > 1<<31 {
		return 0, false
	}
	return int(f), true
}

// intOf is a value as an integer, read loosely as gjson's Int reads one:
// a number truncated, a string of digits, true as 1; anything else
// (absent: nil) 0.
func intOf(v *fastjson.Value) int64 {
	if v == nil {
		return 0
	}
	switch v.Type() {
	case fastjson.TypeNumber:
		f, _ := v.Float64()
		return int64(f)
	case fastjson.TypeString:
		n, _ := strconv.ParseInt(bytesView(v.GetStringBytes()), 10, 64)
		return n
	case fastjson.TypeTrue:
		return 1
	}
	return 0
}

// readMessages checks a chat messages array and sums its text size.
func (r *request) readMessages(v *fastjson.Value) error {
	msgs, e := v.Array()
	if e != nil {
		return badParam("messages", "must be an array of message objects")
	}
	for i, m := range msgs {
		if m.Type() != fastjson.TypeObject {
			return badParam("messages["+strconv.Itoa(i)+"]", "must be an object")
		}
		role := m.Get("role")
		if role == nil || role.Type() != fastjson.TypeString {
			return badParam("messages["+strconv.Itoa(i)+"].role", "required string")
		}
		content := m.Get("content")
		n, ok := contentSize(content)
		if !ok {
			return badParam("messages["+strconv.Itoa(i)+"].content", "must be a string or an array of content parts")
		}
		if i == 0 {
			// The system prompt is what requests of one application share;
			// without one, the start of the first message stands in.
			r.prefixHash = firstTextHash(content)
		}
		r.promptBytes += n + len(role.GetStringBytes())
		r.messages++
	}
	if r.messages == 0 {
		return badParam("messages", "must not be empty")
	}
	return nil
}

// firstTextHash hashes the first text in a content value (a string, or the
// first text part / string of an array); 0 when there is none (nil too).
func firstTextHash(v *fastjson.Value) uint64 {
	if v == nil {
		return 0
	}
	switch v.Type() {
	case fastjson.TypeString:
		if s := v.GetStringBytes(); len(s) > 0 {
			return prefixHashOf(bytesView(s))
		}
	case fastjson.TypeArray:
		a, _ := v.Array()
		for _, e := range a {
			var s []byte
			switch e.Type() {
			case fastjson.TypeString:
				s = e.GetStringBytes()
			case fastjson.TypeObject:
				s = e.GetStringBytes("text")
			}
			if len(s) > 0 {
				return prefixHashOf(bytesView(s))
			}
		}
	}
	return 0
}

// contentSize sizes a message content: absent (nil), null, a string, or an
// array of parts where text parts carry "text"; false for anything else
// (the caller names the field: a name built only for an error).
func contentSize(c *fastjson.Value) (int, bool) {
	if c == nil {
		return 0, true
	}
	switch c.Type() {
	case fastjson.TypeNull:
		return 0, true
	case fastjson.TypeString:
		return len(c.GetStringBytes()), true
	case fastjson.TypeArray:
		n := 0
		a, _ := c.Array()
		for _, part := range a {
			n += len(part.GetStringBytes("text"))
		}
		return n, true
	}
	return 0, false
}

// textSize sizes a completions prompt or embeddings input: a string, an
// array of strings, or token ids (counted at 4 bytes a token).
func textSize(param string, v *fastjson.Value) (int, error) {
	switch v.Type() {
	case fastjson.TypeString:
		return len(v.GetStringBytes()), nil
	case fastjson.TypeArray:
		n := 0
		a, _ := v.Array()
		for _, e := range a {
			switch e.Type() {
			case fastjson.TypeString:
				n += len(e.GetStringBytes())
			case fastjson.TypeNumber:
				n += 4
			case fastjson.TypeArray:
				ids, _ := e.Array()
				n += 4 * len(ids)
			default:
				return 0, badParam(param, "must be a string, an array of strings or an array of token ids")
			}
		}
		return n, nil
	}
	return 0, badParam(param, "must be a string, an array of strings or an array of token ids")
}

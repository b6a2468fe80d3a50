package openai

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"
)

// ErrBadRequest is a request the router can't read: malformed JSON, a
// field of the wrong type (a ParamError names it).
var ErrBadRequest = errors.New("bad request")

// ParamError is a bad-request error that names the offending field, so the
// OpenAI body's "param" says which one.
type ParamError struct {
	Param string
	msg   string
}

func (e *ParamError) Error() string { return e.Param + ": " + e.msg }
func (e *ParamError) Unwrap() error { return ErrBadRequest }

func BadParam(param, msg string) error { return &ParamError{Param: param, msg: msg} }

// Endpoint is which OpenAI API a request is for.
type Endpoint uint8

const (
	Chat Endpoint = iota + 1
	Completions
	Embeddings
)

// Path is the upstream path of the endpoint.
func (e Endpoint) Path() string {
	switch e {
	case Chat:
		return "/v1/chat/completions"
	case Completions:
		return "/v1/completions"
	case Embeddings:
		return "/v1/embeddings"
	}
	return ""
}

func (e Endpoint) String() string {
	switch e {
	case Chat:
		return "chat"
	case Completions:
		return "completions"
	case Embeddings:
		return "embeddings"
	}
	return "unknown"
}

// Request is what the router needs from a client request body, read in one
// pass. Strings are copies: they outlive the fasthttp body buffer.
type Request struct {
	Model       string // "" when the body has none
	Stream      bool
	ClientUsage bool         // the client asked for stream_options.include_usage itself
	hasOptions  bool         // stream_options is present and an object
	optionsKey  bool         // stream_options is present, an object or not (null)
	Cont        ContFlags    // what a continuation on another replica must know (migrate.go)
	MaxTokens   int          // the output limit the engine applies: max_completion_tokens, else max_tokens; 0 when unset
	limits      [2]outputKey // max_tokens, max_completion_tokens as given (see outputKeyName)
	PromptBytes int          // bytes of prompt text (messages' content, prompt, input)
	messages    int          // chat messages
	User        string
	PrefixHash  uint64 // hash of the system prompt, else of the prompt's first PrefixBytes; 0 if no text
}

// outputKeyName is the name of output limit i, the two a client may limit its
// output by, in the order Request.limits keeps them: max_tokens (0),
// max_completion_tokens (1).
func outputKeyName(i int) string {
	if i == 0 {
		return "max_tokens"
	}
	return "max_completion_tokens"
}

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

// PrefixBytes is how much of a prompt without a system message identifies
// its prefix for prefix-affinity routing: about 256 tokens.
const PrefixBytes = 1024

// PrefixHashOf hashes a prompt prefix (xxHash64) and never returns 0,
// which means "no prefix". Deterministic across processes so every router
// instance sends a prefix to the same replica. xxHash reads eight bytes at
// a time: a 1 KiB prefix costs ~0.1 µs, where the byte-at-a-time FNV-1a it
// replaced cost ~1 µs on every request with a long system prompt.
func PrefixHashOf(s string) uint64 {
	if len(s) > PrefixBytes {
		s = s[:PrefixBytes]
	}
	return xxhash.Sum64String(s) | 1
}

// PromptTokens estimates the prompt size in tokens from its bytes (about 4
// bytes per token in English text, OpenAI's rule of thumb). The admission
// controller refines estimates with a real tokenizer; routing only needs
// the order of magnitude.
func (r *Request) PromptTokens() int { return (r.PromptBytes + 3) / 4 }

// BytesView returns a string sharing b's memory, so a parser can scan the
// body without copying it. The result must not outlive b or be retained:
// every string kept from it is cloned.
func BytesView(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// ReadRequest reads the fields the router needs from a JSON body and checks
// their types, naming the first offending field. The body is validated
// first (CheckJSON: strict JSON, as gjson reads it, nested no more than
// the parser goes), its members noted as it is (CheckJSONMembers); those
// the router reads are then parsed by p, one at a time, within one
// bound on the tree (memberParser, jsonscan.go); a prompt of token ids is
// read from its bytes (IDArrays). The body is left as it is; what the
// request keeps is copied out of p, free for the next body once
// ReadRequest returns. fastjson reads a member in one pass where gjson's
// top-level walk skipped the messages, its second walk went through them
// again, and each lookup in a message scanned it anew; its parser alone is
// not a validator (it takes leading zeros, control characters and unknown
// escapes), hence the check before it. A lone surrogate escape ("\ud800"
// alone) stays as written where gjson made it U+FFFD: only the size and
// prefix hash of such a (not Unicode) string move.
func ReadRequest(p *fastjson.Parser, body []byte, ep Endpoint) (Request, error) {
	var r Request
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return r, BadParam("body", "empty request body; expected a JSON object")
	}
	var members ObjectMembers
	switch err := CheckJSONMembers(trimmed, &members); {
	case errors.Is(err, ErrJSONDepth):
		return r, BadParam("body", fmt.Sprintf("JSON nested more than %d levels deep", MaxJSONDepth))
	case err != nil:
		return r, BadParam("body", "malformed JSON")
	}
	if trimmed[0] != '{' {
		return r, BadParam("body", "expected a JSON object")
	}
	var sawInput bool
	mp := NewMemberParser(p)
	err := members.Each(trimmed, func(key, raw []byte) error {
		switch k := MemberKey(p, key); k {
		case "model":
			if RawType(raw) != fastjson.TypeString {
				return BadParam("model", "must be a string")
			}
			v, err := mp.Tree(k, raw)
			if err != nil {
				return err
			}
			r.Model = string(v.GetStringBytes())
		case "stream":
			t := RawType(raw)
			if t != fastjson.TypeTrue && t != fastjson.TypeFalse && t != fastjson.TypeNull {
				return BadParam("stream", "must be a boolean")
			}
			r.Stream = t == fastjson.TypeTrue
		case "stream_options":
			r.optionsKey = true
			switch RawType(raw) {
			case fastjson.TypeNull:
				return nil
			case fastjson.TypeObject:
			default:
				return BadParam("stream_options", "must be an object")
			}
			r.hasOptions = true
			v, err := mp.Tree(k, raw)
			if err != nil {
				return err
			}
			iu := v.Get("include_usage")
			if iu != nil {
				if t := iu.Type(); t != fastjson.TypeTrue && t != fastjson.TypeFalse && t != fastjson.TypeNull {
					return BadParam("stream_options.include_usage", "must be a boolean")
				}
				r.ClientUsage = iu.Type() == fastjson.TypeTrue
			}
			if c := v.Get("continuous_usage_stats"); c != nil && c.Type() == fastjson.TypeTrue {
				r.Cont |= ContNo // per-chunk usage can't be made to add up across replicas
			}
		case "max_tokens", "max_completion_tokens":
			i := 0
			if k == outputKeyName(1) {
				i = 1
			}
			// The engine reads the last of a repeated key, a rewrite (and
			// the router's cost) the first: refuse the ambiguity.
			if r.limits[i].given {
				return BadParam(outputKeyName(i), "given more than once")
			}
			r.limits[i].given = true
			if RawType(raw) == fastjson.TypeNull {
				r.limits[i].null = true
				return nil
			}
			n, ok := 0, false
			if RawType(raw) == fastjson.TypeNumber {
				v, err := mp.Tree(outputKeyName(i), raw)
				if err != nil {
					return err
				}
				n, ok = nonNegInt(v)
			}
			if !ok {
				return BadParam(outputKeyName(i), "must be a non-negative integer")
			}
			r.limits[i].n = uint32(n)
		case "user":
			switch RawType(raw) {
			case fastjson.TypeNull:
				r.User = ""
			case fastjson.TypeString:
				v, err := mp.Tree(k, raw)
				if err != nil {
					return err
				}
				r.User = string(v.GetStringBytes())
			default:
				return BadParam("user", "must be a string")
			}
		case "messages":
			if ep != Chat {
				return nil
			}
			sawInput = true
			v, err := mp.Tree(k, raw)
			if err != nil {
				return err
			}
			return r.readMessages(v)
		case "prompt":
			if ep != Completions {
				return nil
			}
			sawInput = true
			if size, cont, ok := IDArrays(raw); ok {
				r.PromptBytes, r.PrefixHash = size, 0
				r.Cont |= cont
				return nil
			}
			v, err := mp.Tree(k, raw)
			if err != nil {
				return err
			}
			if r.PromptBytes, err = TextSize("prompt", v); err != nil {
				return err
			}
			r.PrefixHash = firstTextHash(v)
			r.Cont |= PromptCont(v)
		case "input":
			if ep != Embeddings {
				return nil
			}
			sawInput = true
			if size, _, ok := IDArrays(raw); ok {
				r.PromptBytes = size
				return nil
			}
			v, err := mp.Tree(k, raw)
			if err != nil {
				return err
			}
			r.PromptBytes, err = TextSize("input", v)
			return err
		default:
			c, err := continuation(&mp, k, raw)
			r.Cont |= c
			return err
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	r.MaxTokens = effectiveMax(r.limits)
	if !sawInput {
		switch ep {
		case Chat:
			return r, BadParam("messages", "required")
		case Completions:
			return r, BadParam("prompt", "required")
		case Embeddings:
			return r, BadParam("input", "required")
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

// IntOf is a value as an integer, read loosely as gjson's Int reads one:
// a number truncated, a string of digits, true as 1; anything else
// (absent: nil) 0.
func IntOf(v *fastjson.Value) int64 {
	if v == nil {
		return 0
	}
	switch v.Type() {
	case fastjson.TypeNumber:
		f, _ := v.Float64()
		return int64(f)
	case fastjson.TypeString:
		n, _ := strconv.ParseInt(BytesView(v.GetStringBytes()), 10, 64)
		return n
	case fastjson.TypeTrue:
		return 1
	}
	return 0
}

// readMessages checks a chat messages array and sums its text size.
func (r *Request) readMessages(v *fastjson.Value) error {
	msgs, e := v.Array()
	if e != nil {
		return BadParam("messages", "must be an array of message objects")
	}
	for i, m := range msgs {
		if m.Type() != fastjson.TypeObject {
			return BadParam("messages["+strconv.Itoa(i)+"]", "must be an object")
		}
		role := m.Get("role")
		if role == nil || role.Type() != fastjson.TypeString {
			return BadParam("messages["+strconv.Itoa(i)+"].role", "required string")
		}
		content := m.Get("content")
		n, ok := contentSize(content)
		if !ok {
			return BadParam("messages["+strconv.Itoa(i)+"].content", "must be a string or an array of content parts")
		}
		if i == 0 {
			// The system prompt is what requests of one application share;
			// without one, the start of the first message stands in.
			r.PrefixHash = firstTextHash(content)
		}
		r.PromptBytes += n + len(role.GetStringBytes())
		r.messages++
	}
	if r.messages == 0 {
		return BadParam("messages", "must not be empty")
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
			return PrefixHashOf(BytesView(s))
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
				return PrefixHashOf(BytesView(s))
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

// TextSize sizes a completions prompt or embeddings input: a string, an
// array of strings, or token ids (counted at 4 bytes a token).
func TextSize(param string, v *fastjson.Value) (int, error) {
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
				return 0, BadParam(param, "must be a string, an array of strings or an array of token ids")
			}
		}
		return n, nil
	}
	return 0, BadParam(param, "must be a string, an array of strings or an array of token ids")
}

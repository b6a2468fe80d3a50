package proxy

import (
	"bytes"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"github.com/tidwall/gjson"
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

// bytesView returns a string sharing b's memory, so gjson can scan the body
// without copying it. The result must not outlive b or be retained: every
// string kept from it is cloned (see parseRequest).
func bytesView(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// parseRequest reads the fields the router needs from a JSON body and checks
// their types, naming the first offending field.
func parseRequest(body []byte, ep endpoint) (request, error) {
	var r request
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return r, badParam("body", "empty request body; expected a JSON object")
	}
	view := bytesView(trimmed)
	if !gjson.Valid(view) {
		return r, badParam("body", "malformed JSON")
	}
	if trimmed[0] != '{' {
		return r, badParam("body", "expected a JSON object")
	}
	var err error
	var sawInput bool
	gjson.Parse(view).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "model":
			if v.Type != gjson.String {
				err = badParam("model", "must be a string")
				return false
			}
			r.model = strings.Clone(v.Str)
		case "stream":
			if v.Type != gjson.True && v.Type != gjson.False && v.Type != gjson.Null {
				err = badParam("stream", "must be a boolean")
				return false
			}
			r.stream = v.Type == gjson.True
		case "stream_options":
			r.optionsKey = true
			if v.Type == gjson.Null {
				return true
			}
			if !v.IsObject() {
				err = badParam("stream_options", "must be an object")
				return false
			}
			r.hasOptions = true
			iu := v.Get("include_usage")
			if iu.Exists() && iu.Type != gjson.True && iu.Type != gjson.False && iu.Type != gjson.Null {
				err = badParam("stream_options.include_usage", "must be a boolean")
				return false
			}
			r.clientUsage = iu.Type == gjson.True
			if v.Get("continuous_usage_stats").Type == gjson.True {
				r.cont |= contNo // per-chunk usage can't be made to add up across replicas
			}
		case "max_tokens", "max_completion_tokens":
			i := 0
			if k.Str == outputKeys[1] {
				i = 1
			}
			// The engine reads the last of a repeated key, a rewrite (and
			// the router's cost) the first: refuse the ambiguity.
			if r.limits[i].given {
				err = badParam(k.Str, "given more than once")
				return false
			}
			r.limits[i].given = true
			if v.Type == gjson.Null {
				r.limits[i].null = true
				return true
			}
			n, ok := nonNegInt(v)
			if !ok {
				err = badParam(k.Str, "must be a non-negative integer")
				return false
			}
			r.limits[i].n = uint32(n)
		case "user":
			if v.Type != gjson.String && v.Type != gjson.Null {
				err = badParam("user", "must be a string")
				return false
			}
			r.user = strings.Clone(v.Str)
		case "messages":
			if ep != epChat {
				return true
			}
			sawInput = true
			err = r.readMessages(v)
		case "prompt":
			if ep != epCompletions {
				return true
			}
			sawInput = true
			r.promptBytes, err = textSize("prompt", v)
			r.prefixHash = firstTextHash(v)
			r.cont |= promptCont(v)
		case "input":
			if ep != epEmbeddings {
				return true
			}
			sawInput = true
			r.promptBytes, err = textSize("input", v)
		default:
			r.cont |= continuation(k.Str, v)
		}
		return err == nil
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

func nonNegInt(v gjson.Result) (int, bool) {
	if v.Type != gjson.Number {
		return 0, false
	}
	f := v.Float()
	if f < 0 || f != float64(int64(f)) || f > 1<<31 {
		return 0, false
	}
	return int(f), true
}

// readMessages checks a chat messages array and sums its text size.
func (r *request) readMessages(v gjson.Result) error {
	if !v.IsArray() {
		return badParam("messages", "must be an array of message objects")
	}
	var err error
	i := 0
	v.ForEach(func(_, m gjson.Result) bool {
		if !m.IsObject() {
			err = badParam("messages["+strconv.Itoa(i)+"]", "must be an object")
			return false
		}
		role := m.Get("role")
		if role.Type != gjson.String {
			err = badParam("messages["+strconv.Itoa(i)+"].role", "required string")
			return false
		}
		var n int
		content := m.Get("content")
		var ok bool
		if n, ok = contentSize(content); !ok {
			err = badParam("messages["+strconv.Itoa(i)+"].content", "must be a string or an array of content parts")
		}
		if i == 0 {
			// The system prompt is what requests of one application share;
			// without one, the start of the first message stands in.
			r.prefixHash = firstTextHash(content)
		}
		r.promptBytes += n + len(role.Str)
		r.messages++
		i++
		return err == nil
	})
	if err == nil && r.messages == 0 {
		err = badParam("messages", "must not be empty")
	}
	return err
}

// firstTextHash hashes the first text in a content value (a string, or the
// first text part / string of an array); 0 when there is none.
func firstTextHash(v gjson.Result) uint64 {
	switch {
	case v.Type == gjson.String && v.Str != "":
		return prefixHashOf(v.Str)
	case v.IsArray():
		var h uint64
		v.ForEach(func(_, e gjson.Result) bool {
			switch {
			case e.Type == gjson.String && e.Str != "":
				h = prefixHashOf(e.Str)
			case e.IsObject() && e.Get("text").Str != "":
				h = prefixHashOf(e.Get("text").Str)
			}
			return h == 0
		})
		return h
	}
	return 0
}

// contentSize sizes a message content: a string, null, or an array of parts
// where text parts carry "text"; false for anything else (the caller names
// the field: a name built only for an error).
func contentSize(c gjson.Result) (int, bool) {
	switch {
	case !c.Exists() || c.Type == gjson.Null:
		return 0, true
	case c.Type == gjson.String:
		return len(c.Str), true
	case c.IsArray():
		n := 0
		c.ForEach(func(_, part gjson.Result) bool {
			n += len(part.Get("text").Str)
			return true
		})
		return n, true
	}
	return 0, false
}

// textSize sizes a completions prompt or embeddings input: a string, an
// array of strings, or token ids (counted at 4 bytes a token).
func textSize(param string, v gjson.Result) (int, error) {
	switch {
	case v.Type == gjson.String:
		return len(v.Str), nil
	case v.IsArray():
		n := 0
		ok := true
		v.ForEach(func(_, e gjson.Result) bool {
			switch {
			case e.Type == gjson.String:
				n += len(e.Str)
			case e.Type == gjson.Number:
				n += 4
			case e.IsArray():
				n += 4 * len(e.Array())
			default:
				ok = false
			}
			return ok
		})
		if !ok {
			return 0, badParam(param, "must be a string, an array of strings or an array of token ids")
		}
		return n, nil
	}
	return 0, badParam(param, "must be a string, an array of strings or an array of token ids")
}

// contFlags is what the parser learns about continuing a request's
// generation on another replica should its own die mid-stream (migrate.go).
// The zero value: it can be continued, from text, with nothing special.
type contFlags uint8

const (
	// contNo: the request can't be continued — several choices, logprobs,
	// beam search, echo, a suffix, structured output (the grammar would
	// restart on the continuation), prompt embeddings, several prompts,
	// per-chunk usage.
	contNo        contFlags = 1 << iota
	contPromptIDs           // the completion prompt is token ids: continued from ids only
	contClientIDs           // the client asked for return_token_ids itself: not stripped
	contFinal               // the client set continue_final_message: its last message grows
)

// continuation reads one request key for what continuing it needs.
func continuation(key string, v gjson.Result) contFlags {
	set := v.Type != gjson.Null && v.Type != gjson.False
	switch key {
	case "n", "best_of":
		if set && v.Int() > 1 {
			return contNo
		}
	case "logprobs", "top_logprobs", "echo", "use_beam_search", "suffix", "prompt_embeds",
		"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs":
		if set && !(key == "top_logprobs" && v.Int() == 0) {
			return contNo
		}
	case "response_format":
		if set && v.Get("type").Str != "text" {
			return contNo
		}
	case "return_token_ids":
		if v.Type == gjson.True {
			return contClientIDs
		}
	case "continue_final_message":
		if v.Type == gjson.True {
			return contFinal
		}
	}
	return 0
}

// promptCont says how a completion prompt can be continued: a string or
// one string with its text, token ids (one list) with ids only; several
// prompts not at all.
func promptCont(v gjson.Result) contFlags {
	if !v.IsArray() {
		return 0
	}
	var f contFlags
	n := 0
	v.ForEach(func(_, e gjson.Result) bool {
		n++
		switch {
		case n == 1 && e.Type == gjson.Number: // one prompt of token ids
			f = contPromptIDs
			return false
		case n > 1: // several prompts
			f = contNo
			return false
		case e.IsArray():
			f = contPromptIDs
		}
		return true
	})
	return f
}

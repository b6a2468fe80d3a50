package openai

import "github.com/valyala/fastjson"

// ContFlags is what the parser learns about continuing a request's
// generation on another replica should its own die mid-stream (migrate.go).
// The zero value: it can be continued, from text, with nothing special.
type ContFlags uint8

const (
	// contNo: the request can't be continued — several choices, logprobs,
	// beam search, echo, a suffix, structured output (the grammar would
	// restart on the continuation), prompt embeddings, several prompts,
	// per-chunk usage.
	ContNo        ContFlags = 1 << iota
	ContPromptIDs           // the completion prompt is token ids: continued from ids only
	ContClientIDs           // the client asked for return_token_ids itself: not stripped
	ContFinal               // the client set continue_final_message: its last message grows
)

// continuation reads one request key for what continuing it needs; the
// keys it does not name are not parsed.
func continuation(mp *memberParser, key string, raw []byte) (ContFlags, error) {
	t := RawType(raw)
	set := t != fastjson.TypeNull && t != fastjson.TypeFalse
	// IntOf the value, parsed only when it is read.
	n := func() (int64, error) {
		v, err := mp.Tree(key, raw)
		if err != nil {
			return 0, err
		}
		return IntOf(v), nil
	}
	switch key {
	case "n", "best_of":
		if !set {
			return 0, nil
		}
		if i, err := n(); err != nil || i > 1 {
			return ContNo, err
		}
	case "logprobs", "top_logprobs", "echo", "use_beam_search", "suffix", "prompt_embeds",
		"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs":
		if !set {
			return 0, nil
		}
		if key == "top_logprobs" {
			if i, err := n(); err != nil || i == 0 {
				return 0, err
			}
		}
		return ContNo, nil
	case "response_format":
		if !set {
			return 0, nil
		}
		v, err := mp.Tree(key, raw)
		if err != nil {
			return 0, err
		}
		if string(v.GetStringBytes("type")) != "text" {
			return ContNo, nil
		}
	case "return_token_ids":
		if t == fastjson.TypeTrue {
			return ContClientIDs, nil
		}
	case "continue_final_message":
		if t == fastjson.TypeTrue {
			return ContFinal, nil
		}
	}
	return 0, nil
}

// PromptCont says how a completion prompt can be continued: a string or
// one string with its text, token ids (one list) with ids only; several
// prompts not at all.
func PromptCont(v *fastjson.Value) ContFlags {
	a, err := v.Array()
	if err != nil {
		return 0
	}
	var f ContFlags
	for n, e := range a {
		switch {
		case n == 0 && e.Type() == fastjson.TypeNumber: // one prompt of token ids
			return ContPromptIDs
		case n > 0: // several prompts
			return ContNo
		case e.Type() == fastjson.TypeArray:
			f = ContPromptIDs
		}
	}
	return f
}

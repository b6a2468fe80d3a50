package proxy

import "github.com/valyala/fastjson"

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

// continuation reads one request key for what continuing it needs; the
// keys it does not name are not parsed.
func continuation(mp *memberParser, key string, raw []byte) (contFlags, error) {
	t := rawType(raw)
	set := t != fastjson.TypeNull && t != fastjson.TypeFalse
	// intOf the value, parsed only when it is read.
	n := func() (int64, error) {
		v, err := mp.tree(key, raw)
		if err != nil {
			return 0, err
		}
		return intOf(v), nil
	}
	switch key {
	case "n", "best_of":
		if !set {
			return 0, nil
		}
		if i, err := n(); err != nil || i > 1 {
			return contNo, err
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
		return contNo, nil
	case "response_format":
		if !set {
			return 0, nil
		}
		v, err := mp.tree(key, raw)
		if err != nil {
			return 0, err
		}
		if string(v.GetStringBytes("type")) != "text" {
			return contNo, nil
		}
	case "return_token_ids":
		if t == fastjson.TypeTrue {
			return contClientIDs, nil
		}
	case "continue_final_message":
		if t == fastjson.TypeTrue {
			return contFinal, nil
		}
	}
	return 0, nil
}

// promptCont says how a completion prompt can be continued: a string or
// one string with its text, token ids (one list) with ids only; several
// prompts not at all.
func promptCont(v *fastjson.Value) contFlags {
	a, err := v.Array()
	if err != nil {
		return 0
	}
	var f contFlags
	for n, e := range a {
		switch {
		case n == 0 && e.Type() == fastjson.TypeNumber: // one prompt of token ids
			return contPromptIDs
		case n > 0: // several prompts
			return contNo
		case e.Type() == fastjson.TypeArray:
			f = contPromptIDs
		}
	}
	return f
}

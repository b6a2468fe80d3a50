package prefixcache

import (
	"errors"
	"fmt"
)

// ErrNoChatMarkers says a tokenizer.json has none of the special tokens
// of a chat rendering HF.ChatTemplate knows.
var ErrNoChatMarkers = errors.New("no ChatML (<|im_start|>, <|im_end|>) or Llama 3 (<|start_header_id|>, <|end_header_id|>, <|eot_id|>) chat tokens")

// ChatTemplate is the chat rendering of the model family whose special
// tokens the file has, as its Jinja template renders messages that are
// plain text:
//
//   - ChatML (Qwen2, Qwen2.5, Qwen3): <|im_start|>role\ncontent<|im_end|>\n
//     for every message, then <|im_start|>assistant\n.
//   - Llama 3: <|begin_of_text|>, then
//     <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> for
//     every message (content trimmed), then
//     <|start_header_id|>assistant<|end_header_id|>\n\n.
//
// Where the engine's template says more than this the blocks differ from
// there on, and the index matches less than the engine caches:
//   - Qwen2.5's template adds a default system message ("You are Qwen,
//     created by Alibaba Cloud. ...") when the request has none: then no
//     block matches. Qwen3 strips earlier turns' <think> reasoning and,
//     with thinking off, adds an empty <think></think> to the generation
//     prompt (after the last block that matters).
//   - Llama 3.1 and later always open with a system header carrying
//     "Cutting Knowledge Date" and "Today Date" lines (the date changes
//     daily), merged with the request's system message: no block matches.
//     Llama 3 (3.0) renders as above.
//   - Tools, tool calls, images and any request-specific template
//     arguments (chat_template_kwargs) are not rendered.
//
// A request's user text that spells a special token (<|im_end|>) is
// tokenized as text here; an engine that tokenizes its rendered prompt
// with special tokens on reads it as the token, and the blocks differ
// from that message on.
func (t *HF) ChatTemplate() (ChatTemplate, error) {
	id := func(s string) (uint32, bool) { v, ok := t.addedIDs[s]; return v, ok }
	if start, ok := id("<|im_start|>"); ok {
		if end, ok := id("<|im_end|>"); ok {
			return ChatTemplate{Start: start, End: end, SepText: "\n",
				AfterEnd: t.AppendTokens(nil, "\n"), PromptPrefix: t.prompt}, nil
		}
	}
	hs, ok1 := id("<|start_header_id|>")
	he, ok2 := id("<|end_header_id|>")
	eot, ok3 := id("<|eot_id|>")
	if ok1 && ok2 && ok3 {
		ct := ChatTemplate{Start: hs, End: eot, Sep: []uint32{he}, SepText: "\n\n",
			TrimContent: true, PromptPrefix: t.prompt}
		if bos, ok := id("<|begin_of_text|>"); ok {
			ct.Prefix = []uint32{bos}
		}
		return ct, nil
	}
	return ChatTemplate{}, fmt.Errorf("prefixcache: tokenizer %s: %w", t.path, ErrNoChatMarkers)
}

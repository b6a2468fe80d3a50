package openai

import (
	"github.com/valyala/fastjson"
)

// PromptSink receives a request's prompt text as ReadRequestTo reads it,
// so that a router keying prompts by their content (a prefix-cache index)
// reads the body once. The slices are valid only during the call.
type PromptSink interface {
	// Turn starts a chat message of role; its content follows as Text.
	Turn(role []byte)
	// Text adds prompt text: the current message's content (each text
	// part in order), or a completion's prompt string.
	Text(text []byte)
}

// ReadRequestTo is ReadRequest that also hands the prompt's text to sink
// (nil: none): a chat request's messages in order, each its role then its
// content's text; a completion's prompt when it is one string (or an
// array of one). A prompt of token ids, or of several strings, gives
// nothing.
func ReadRequestTo(p *fastjson.Parser, body []byte, ep Endpoint, sink PromptSink) (Request, error) {
	return readRequest(p, body, ep, sink)
}

// writeMessage hands one chat message to sink: its role, then the text
// of its content (a string, or the "text" of each part of an array) as
// the simulator and vLLM's text-only templates read it.
func writeMessage(sink PromptSink, role, content *fastjson.Value) {
	if sink == nil {
		return
	}
	sink.Turn(role.GetStringBytes())
	if content == nil {
		return
	}
	switch content.Type() {
	case fastjson.TypeString:
		sink.Text(content.GetStringBytes())
	case fastjson.TypeArray:
		a, _ := content.Array()
		for _, part := range a {
			if t := part.GetStringBytes("text"); len(t) > 0 {
				sink.Text(t)
			}
		}
	}
}

// writePrompt hands a completion's prompt to sink when it is one string.
func writePrompt(sink PromptSink, v *fastjson.Value) {
	if sink == nil {
		return
	}
	switch v.Type() {
	case fastjson.TypeString:
		sink.Text(v.GetStringBytes())
	case fastjson.TypeArray:
		if a, _ := v.Array(); len(a) == 1 && a[0].Type() == fastjson.TypeString {
			sink.Text(a[0].GetStringBytes())
		}
	}
}

package proxy

import (
	"fmt"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// continuation is the request that makes another replica go on with the
// stream: the original body, its sampling parameters and stop sequences
// untouched, with the output so far put after the prompt and the output
// limits reduced by it.
//
//   - Completions whose prompt and output token ids are known: the prompt
//     is those ids, exactly what the dead engine held.
//   - Other completions: the prompt text plus the text generated so far
//     (re-tokenised by the engine: at the join it may split a word
//     differently than the first engine did).
//   - Chat: the messages plus a partial assistant message holding the text
//     so far, with vLLM's continue_final_message (add_generation_prompt
//     off), so the chat template leaves it open and the model continues it;
//     a client's own partial assistant message grows instead.
//
// Nothing generated yet: the original body, whole.
func (m *migration) continuation() ([]byte, error) {
	if m.tokens == 0 && len(m.buf.text) == 0 {
		return m.body, nil
	}
	body := append([]byte(nil), m.body...)
	var err error
	switch {
	case !m.chat && m.idsOK && m.promptN > 0:
		ids := make([]byte, 0, len(m.buf.promptIDs)+len(m.buf.ids)+3)
		ids = append(append(append(ids, '['), m.buf.promptIDs...), ',')
		ids = append(append(ids, m.buf.ids...), ']')
		body, err = sjson.SetRawBytes(body, "prompt", ids)
	case !m.chat:
		body, err = appendToString(body, "prompt", m.buf.text)
	case m.prefill:
		last := gjson.GetBytes(body, "messages.#").Int() - 1
		body, err = appendToString(body, fmt.Sprintf("messages.%d.content", last), m.buf.text)
	default:
		msg := make([]byte, 0, len(m.buf.text)+40)
		msg = append(msg, `{"role":"assistant","content":"`...)
		msg = append(append(msg, m.buf.text...), `"}`...)
		if body, err = sjson.SetRawBytes(body, "messages.-1", msg); err == nil {
			body, err = sjson.SetBytes(body, "continue_final_message", true)
		}
		if err == nil {
			body, err = sjson.SetBytes(body, "add_generation_prompt", false)
		}
	}
	if err != nil {
		return nil, err
	}
	// What the first replicas generated counts against every limit.
	for _, k := range [...]string{"max_tokens", "max_completion_tokens", "min_tokens"} {
		v := gjson.GetBytes(body, k)
		if v.Type != gjson.Number {
			continue
		}
		left := v.Int() - int64(m.tokens)
		if k != "min_tokens" && left < 1 {
			return nil, fmt.Errorf("%s %d used up", k, v.Int())
		}
		if body, err = sjson.SetBytes(body, k, max(left, 0)); err != nil {
			return nil, err
		}
	}
	return body, nil
}

// appendToString appends text (JSON-escaped already) to the string at path:
// a string, or a list of one string (a completion prompt).
func appendToString(body []byte, path string, text []byte) ([]byte, error) {
	v := gjson.GetBytes(body, path)
	if v.IsArray() {
		path += ".0"
		v = gjson.GetBytes(body, path)
	}
	if v.Type != gjson.String {
		if v.Type == gjson.Number || v.IsArray() {
			return nil, errNoIDs
		}
		return nil, fmt.Errorf("%s is not text", path)
	}
	raw := v.Raw // the quoted, escaped string as the client sent it
	s := make([]byte, 0, len(raw)+len(text))
	s = append(append(s, raw[:len(raw)-1]...), text...)
	return sjson.SetRawBytes(body, path, append(s, '"'))
}

package sim

import "encoding/json"

// completion is the non-streaming response document.
func (q *request) completion(reason finishReason) any {
	text := string(q.appendTextFrom(nil, q.written))
	usage := json.RawMessage(q.appendUsageObject(nil))
	var ids []int
	var promptIDs json.RawMessage
	if q.tokenIDs {
		ids = q.genIDs(q.written)
		promptIDs = q.appendPromptIDs(nil)
	}
	if q.chat {
		type message struct {
			Role      string `json:"role"`
			Content   string `json:"content"`
			ToolCalls []any  `json:"tool_calls"`
		}
		type choice struct {
			Index        int     `json:"index"`
			Message      message `json:"message"`
			Logprobs     any     `json:"logprobs"`
			FinishReason string  `json:"finish_reason"`
			StopReason   any     `json:"stop_reason"`
			TokenIDs     []int   `json:"token_ids,omitempty"`
		}
		return struct {
			ID               string          `json:"id"`
			Object           string          `json:"object"`
			Created          int64           `json:"created"`
			Model            json.RawMessage `json:"model"`
			Choices          []choice        `json:"choices"`
			Usage            json.RawMessage `json:"usage"`
			PromptTokenIDs   json.RawMessage `json:"prompt_token_ids,omitempty"`
			KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
		}{q.id, "chat.completion", q.created, q.model,
			[]choice{{Message: message{Role: "assistant", Content: text, ToolCalls: []any{}}, FinishReason: reason.String(), TokenIDs: ids}}, usage, promptIDs, q.kvTransferParams()}
	}
	type choice struct {
		Index          int             `json:"index"`
		Text           string          `json:"text"`
		Logprobs       any             `json:"logprobs"`
		FinishReason   string          `json:"finish_reason"`
		StopReason     any             `json:"stop_reason"`
		PromptTokenIDs json.RawMessage `json:"prompt_token_ids,omitempty"`
		TokenIDs       []int           `json:"token_ids,omitempty"`
	}
	return struct {
		ID               string          `json:"id"`
		Object           string          `json:"object"`
		Created          int64           `json:"created"`
		Model            json.RawMessage `json:"model"`
		Choices          []choice        `json:"choices"`
		Usage            json.RawMessage `json:"usage"`
		KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
	}{q.id, "text_completion", q.created, q.model, []choice{{Text: text, FinishReason: reason.String(), PromptTokenIDs: promptIDs, TokenIDs: ids}}, usage, q.kvTransferParams()}
}

// appendTextFrom appends the first n generated tokens.
func (q *request) appendTextFrom(b []byte, n int) []byte {
	saved, savedGen := q.written, q.gen
	q.written, q.gen = 0, q.gen0
	b = q.appendText(b, n)
	q.written, q.gen = saved, savedGen
	return b
}

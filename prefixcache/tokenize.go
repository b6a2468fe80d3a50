package prefixcache

import (
	"fmt"
	"strings"

	"github.com/tiktoken-go/tokenizer"
)

// Tokenizer turns text into the token ids an engine computes KV for. A
// pool's index matches an engine's blocks only when both see the same ids:
// the same vocabulary and the same rendering of chat messages (Chat).
type Tokenizer interface {
	// AppendTokens appends text's token ids to dst and returns it.
	AppendTokens(dst []uint32, text string) []uint32
}

// BPE is a Tokenizer over a vocabulary embedded in the binary (tiktoken-go,
// pure Go, no file or network at run time): cl100k_base is the one the
// simulator (bench/sim) and the benchmark's estimator (bench/tokens) use,
// so the router's blocks of a prompt are the simulator's. Safe for
// concurrent use. Build with NewBPE.
type BPE struct {
	codec tokenizer.Codec
	name  string
}

// NewBPE loads an embedded vocabulary: "cl100k_base" (or "" for it) or
// "o200k_base".
func NewBPE(name string) (*BPE, error) {
	enc := tokenizer.Cl100kBase
	switch name {
	case "", "cl100k_base":
		name = "cl100k_base"
	case "o200k_base":
		enc = tokenizer.O200kBase
	default:
		return nil, fmt.Errorf("prefixcache: tokenizer %q: want cl100k_base or o200k_base", name)
	}
	c, err := tokenizer.Get(enc)
	if err != nil {
		return nil, fmt.Errorf("prefixcache: load %s: %w", name, err)
	}
	return &BPE{codec: c, name: name}, nil
}

// Name is the vocabulary's name.
func (t *BPE) Name() string { return t.name }

// AppendTokens implements Tokenizer. Special-token text ("<|endoftext|>")
// is encoded as ordinary text, as engines do with user content.
func (t *BPE) AppendTokens(dst []uint32, text string) []uint32 {
	if text == "" {
		return dst
	}
	ids, _, err := t.codec.Encode(text)
	if err != nil {
		return dst // only strict UTF-8 mode fails, and it is not set
	}
	for _, id := range ids {
		dst = append(dst, uint32(id))
	}
	return dst
}

// Message is one chat message as far as the prompt's tokens go: a role and
// its text (the text parts of a content array, concatenated).
type Message struct {
	Role    string
	Content string
}

// ChatTemplate renders chat messages as token ids, ChatML-style:
//
//	Prefix, then for every message: Start, role, Sep, content, End,
//	AfterEnd; then Start, "assistant", Sep (the generation prompt).
//
// Role and content are tokenized separately, as the template's special
// tokens split a rendered prompt's text anyway — unless SepText is set:
// then the text between two special tokens is tokenized as one, as an
// engine tokenizes a rendered prompt (role, SepText and content when Sep
// is empty; SepText and content after a non-empty Sep).
//
// With only Prefix, Start, End and Sep set this is the rendering of the
// simulator (CL100KChat, bench/sim), so the router's blocks are its
// blocks exactly; HF.ChatTemplate fills the other fields for a model's
// tokenizer.json. A real model's chat template (Jinja, in its
// tokenizer_config.json) may differ: a default system prompt when the
// request has none (Qwen2.5), a date line (Llama 3.1), other separators,
// tools or reasoning markers. Where it does, the blocks diverge from the
// first difference on and the index matches less than the engine caches
// (never more): a prompt's shared system prompt still matches when the
// difference comes after it. The zero value renders nothing but the
// messages' tokens, delimited by id 0: set Start and End.
type ChatTemplate struct {
	Prefix        []uint32 // e.g. a BOS token; may be empty
	Start, End    uint32   // message delimiters (<|im_start|>, <|im_end|>)
	Sep           []uint32 // between role and content ("\n")
	AssistantRole string   // the generation prompt's role; "" = "assistant"
	// SepText is the text that ends a message's header, tokenized with
	// the content that follows ("\n" in ChatML, "\n\n" after Llama 3's
	// <|end_header_id|>); "" = none, and role and content are tokenized
	// apart (the simulator's rendering).
	SepText string
	// AfterEnd is ids after each message's End ("\n" after ChatML's
	// <|im_end|>); may be empty.
	AfterEnd []uint32
	// TrimContent strips each message's leading and trailing white space
	// (Llama 3's template trims).
	TrimContent bool
	// PromptPrefix is the ids an engine puts before a completion's
	// prompt (not a chat's): the tokenizer's BOS when its post-processor
	// adds one (Llama 3). Empty: none.
	PromptPrefix []uint32
}

// CL100KChat is ChatML over cl100k_base: <|im_start|> (100264), role, "\n"
// (198), content, <|im_end|> (100265). Its overhead is 3 tokens a message
// and 3 for the generation prompt, as bench/tokens counts chat requests.
func CL100KChat() ChatTemplate {
	return ChatTemplate{Start: 100264, End: 100265, Sep: []uint32{198}}
}

// AppendChat appends the token ids of msgs rendered by ct, with the
// generation prompt, to dst.
func (ct ChatTemplate) AppendChat(dst []uint32, tok Tokenizer, msgs []Message) []uint32 {
	dst = append(dst, ct.Prefix...)
	for _, m := range msgs {
		dst = ct.appendTurn(dst, tok, m.Role, m.Content, true)
	}
	role := ct.AssistantRole
	if role == "" {
		role = "assistant"
	}
	return ct.appendTurn(dst, tok, role, "", false)
}

// AppendPrompt appends the token ids of a completion's prompt, as an
// engine tokenizes it: PromptPrefix, then the prompt's text.
func (ct ChatTemplate) AppendPrompt(dst []uint32, tok Tokenizer, prompt string) []uint32 {
	return tok.AppendTokens(append(dst, ct.PromptPrefix...), prompt)
}

func (ct ChatTemplate) appendTurn(dst []uint32, tok Tokenizer, role, content string, closed bool) []uint32 {
	dst = append(dst, ct.Start)
	if ct.SepText != "" {
		return ct.appendJoinedTurn(dst, tok, role, content, closed)
	}
	dst = tok.AppendTokens(dst, role)
	dst = append(dst, ct.Sep...)
	if !closed {
		return dst
	}
	dst = tok.AppendTokens(dst, content)
	return append(append(dst, ct.End), ct.AfterEnd...)
}

// appendJoinedTurn is appendTurn after Start when SepText is set: each
// text between two special tokens is tokenized as one.
func (ct ChatTemplate) appendJoinedTurn(dst []uint32, tok Tokenizer, role, content string, closed bool) []uint32 {
	if ct.TrimContent {
		content = strings.TrimSpace(content)
	}
	text := ct.SepText + content
	if len(ct.Sep) == 0 {
		text = role + text
	} else {
		dst = tok.AppendTokens(dst, role)
		dst = append(dst, ct.Sep...)
	}
	dst = tok.AppendTokens(dst, text)
	if !closed {
		return dst
	}
	dst = append(dst, ct.End)
	return append(dst, ct.AfterEnd...)
}

package proxy

import (
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/gpurouter/gpurouter/prefixcache"
)

// promptText is a request's prompt as the pools' prefix indexes key it,
// taken from the body's one parse (openai.PromptSink): hashed into text
// block keys as it is read, for an approximate index, and kept as text
// for a pool whose index is keyed by the engines' tokens (the tokenizer
// runs once the pool is known, in plan). The zero value keeps nothing;
// begin readies it.
type promptText struct {
	text     prefixcache.TextKeys
	hashText bool                  // some pool's index is approximate
	keepText bool                  // some pool's index is keyed by tokens
	chat     bool                  // Turn was called: msgs, else prompt
	msgs     []prefixcache.Message // chat messages, when keepText
	prompt   string                // a completion's prompt, when keepText
	keys     []uint64              // the prompt's keys in its pool's index (plan); nil without one
	cached   int                   // prompt tokens the current attempt's replica holds cached (Request.CachedTokens)
}

// prefixKeysOf is p's keys; nil when p is.
func (p *promptText) prefixKeysOf() []uint64 {
	if p == nil {
		return nil
	}
	return p.keys
}

// cachedTokens is what the current attempt's replica holds of the
// prompt; 0 without a prefix index.
func (p *promptText) cachedTokens() int {
	if p == nil {
		return 0
	}
	return p.cached
}

// Separators of a chat message in its text keys: the role between them,
// the content after, so "user: ab" and "userab" key apart.
var (
	turnStart = []byte{0x1e}
	turnSep   = []byte{0x1f}
)

// Turn implements openai.PromptSink.
func (p *promptText) Turn(role []byte) {
	p.chat = true
	if p.hashText {
		p.text.Write(turnStart)
		p.text.Write(role)
		p.text.Write(turnSep)
	}
	if p.keepText {
		p.msgs = append(p.msgs, prefixcache.Message{Role: string(role)})
	}
}

// Text implements openai.PromptSink.
func (p *promptText) Text(t []byte) {
	if p.hashText {
		p.text.Write(t)
	}
	if !p.keepText {
		return
	}
	if n := len(p.msgs); p.chat && n > 0 {
		p.msgs[n-1].Content += string(t)
		return
	}
	p.prompt += string(t)
}

// promptSink readies x's prompt text for the pools of rt that have a
// prefix index; nil when none has (the body's parse then hashes nothing).
func (x *exchange) promptSink(rt *routeTable) openai.PromptSink {
	var p promptText
	for _, pool := range rt.pools {
		switch pc := pool.PrefixCache(); {
		case pc == nil:
		case pc.Approximate:
			p.hashText = true
		case pc.Tokenizer != nil:
			p.keepText = true
		}
	}
	if !p.hashText && !p.keepText {
		return nil
	}
	if p.hashText {
		p.text.Reset(nil, prefixcache.RootSeed, prefixcache.DefaultBlockBytes)
	}
	// Behind a pointer, allocated only here: the exchange keeps to its
	// size class (size_test.go).
	x.prompt = &p
	return x.prompt
}

// prefixKeys is the request's prompt as pool's prefix index keys it: text
// block keys for an approximate index; for one fed by the engines'
// events, the blocks of the prompt's tokens — rendered by the pool's chat
// template, tokenized by its tokenizer, keyed as prefixcache.Tracker keys
// the engines' blocks — so that they match what the engines report. Nil
// without an index or a prompt of text.
func (p *promptText) prefixKeys(pc *balancer.PrefixCache) []uint64 {
	switch {
	case pc == nil || p == nil:
		return nil
	case pc.Approximate:
		if !p.hashText {
			return nil
		}
		return p.text.Keys()
	case pc.Tokenizer == nil || !p.keepText:
		return nil
	}
	var toks []uint32
	if p.chat {
		toks = pc.Chat.AppendChat(nil, pc.Tokenizer, p.msgs)
	} else if p.prompt != "" {
		toks = pc.Chat.AppendPrompt(nil, pc.Tokenizer, p.prompt) // with the BOS an engine adds
	}
	return prefixcache.AppendKeys(nil, prefixcache.RootSeed, toks, pc.Block())
}

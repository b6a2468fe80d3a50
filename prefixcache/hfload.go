package prefixcache

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dlclark/regexp2/v2"
)

// hfFile is the part of a tokenizer.json HF reads; the polymorphic parts
// stay raw until their "type" is known.
type hfFile struct {
	AddedTokens []struct {
		ID      uint32 `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         struct {
		Type                    string            `json:"type"`
		Dropout                 *float64          `json:"dropout"`
		ContinuingSubwordPrefix string            `json:"continuing_subword_prefix"`
		EndOfWordSuffix         string            `json:"end_of_word_suffix"`
		ByteFallback            bool              `json:"byte_fallback"`
		IgnoreMerges            bool              `json:"ignore_merges"`
		Vocab                   json.RawMessage   `json:"vocab"`
		Merges                  []json.RawMessage `json:"merges"`
	} `json:"model"`
}

// hfComponent is a normalizer, pre-tokenizer, post-processor or decoder:
// its type and the fields HF reads of any of them.
type hfComponent struct {
	Type           string            `json:"type"`
	Normalizers    []json.RawMessage `json:"normalizers"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	Processors     []json.RawMessage `json:"processors"`
	Decoders       []json.RawMessage `json:"decoders"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Pattern        struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior string            `json:"behavior"`
	Invert   bool              `json:"invert"`
	Single   []json.RawMessage `json:"single"`
}

func unsupported(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnsupportedTokenizer}, a...)...)
}

// isNull is whether a component is absent.
func isNull(raw json.RawMessage) bool {
	return len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// ParseHF builds an HF from a tokenizer.json's bytes. It refuses, with
// ErrUnsupportedTokenizer, a file whose tokenization HF would not
// reproduce.
func ParseHF(data []byte) (*HF, error) {
	var f hfFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	t := &HF{addedIDs: map[string]uint32{}}
	m := &f.Model
	switch {
	case m.Type != "BPE" && m.Type != "":
		return nil, unsupported("model.type %q: only byte-level BPE", m.Type)
	case isNull(m.Vocab):
		return nil, unsupported("model has no BPE vocab")
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, unsupported("model.dropout %v", *m.Dropout)
	case m.ByteFallback:
		return nil, unsupported("model.byte_fallback (a SentencePiece-style BPE, not byte-level)")
	case m.ContinuingSubwordPrefix != "" || m.EndOfWordSuffix != "":
		return nil, unsupported("model.continuing_subword_prefix or end_of_word_suffix")
	}
	var err error
	if t.nfc, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	byteLevel := false
	if t.stages, err = parsePreTokenizer(f.PreTokenizer, t.stages, &byteLevel); err != nil {
		return nil, err
	}
	if !byteLevel {
		return nil, unsupported("no ByteLevel pre-tokenizer: only byte-level BPE")
	}
	if err := checkDecoder(f.Decoder); err != nil {
		return nil, err
	}
	var vocab map[string]uint32
	if err := json.Unmarshal(m.Vocab, &vocab); err != nil {
		return nil, fmt.Errorf("model.vocab: %w", err)
	}
	if err := t.buildVocab(vocab, m.Merges); err != nil {
		return nil, err
	}
	t.ignoreMerges = m.IgnoreMerges
	for _, a := range f.AddedTokens {
		if a.Content == "" {
			continue
		}
		t.addedIDs[a.Content] = a.ID
		if !a.Special {
			t.added = append(t.added, addedToken{content: a.Content, id: a.ID})
		}
	}
	if t.prompt, err = parsePostProcessor(f.PostProcessor, t.addedIDs); err != nil {
		return nil, err
	}
	return t, nil
}

// buildVocab keys the vocabulary by the bytes its tokens stand for and
// the merges by their pair of ids.
func (t *HF) buildVocab(vocab map[string]uint32, merges []json.RawMessage) error {
	t.vocab = make(map[string]uint32, len(vocab))
	for s, id := range vocab {
		if b := fromByteLevel(s); b != "" {
			t.vocab[b] = id
		}
	}
	alphabet := byteLevelAlphabet()
	for b := range 256 {
		id, ok := t.vocab[string([]byte{byte(b)})]
		if !ok && (b < 0xC0 || b > 0xC1) && b < 0xF5 {
			return unsupported("vocab lacks byte %#02x (%q)", b, alphabet[b])
		}
		t.byteIDs[b], t.hasByte[b] = id, ok
	}
	t.merges = make(mergeTable, len(merges))
	for rank, raw := range merges {
		a, b, err := parseMerge(raw)
		if err != nil {
			return fmt.Errorf("model.merges[%d]: %w", rank, err)
		}
		ab, bb := fromByteLevel(a), fromByteLevel(b)
		ia, okA := t.vocab[ab]
		ib, okB := t.vocab[bb]
		im, okM := t.vocab[ab+bb]
		if ab == "" || bb == "" || !okA || !okB || !okM {
			return fmt.Errorf("model.merges[%d] %q %q: a token or their merge is not in the vocab", rank, a, b)
		}
		if _, dup := t.merges[pairKey(ia, ib)]; !dup { // the first rank counts
			t.merges[pairKey(ia, ib)] = uint64(rank)<<32 | uint64(im)
		}
	}
	return nil
}

// parseMerge reads a merge in either spelling: "a b" or ["a", "b"].
func parseMerge(raw json.RawMessage) (a, b string, err error) {
	var pair []string
	if err := json.Unmarshal(raw, &pair); err == nil {
		if len(pair) != 2 {
			return "", "", fmt.Errorf("want 2 tokens, got %d", len(pair))
		}
		return pair[0], pair[1], nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", "", fmt.Errorf("want \"a b\" or [\"a\", \"b\"]: %w", err)
	}
	a, b, ok := strings.Cut(s, " ")
	if !ok || strings.Contains(b, " ") {
		return "", "", fmt.Errorf("%q: want two tokens separated by a space", s)
	}
	return a, b, nil
}

// parseNormalizer accepts none or NFC (alone or in a Sequence); an NFC
// text is already what the engine sees for most text, but not all.
func parseNormalizer(raw json.RawMessage) (nfc bool, err error) {
	if isNull(raw) {
		return false, nil
	}
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return false, fmt.Errorf("normalizer: %w", err)
	}
	switch c.Type {
	case "NFC":
		return true, nil
	case "Sequence":
		for _, n := range c.Normalizers {
			one, err := parseNormalizer(n)
			if err != nil {
				return false, err
			}
			nfc = nfc || one
		}
		return nfc, nil
	}
	return false, unsupported("normalizer %q: only NFC or none", c.Type)
}

// maxSplitBacktrack bounds the backtracking of one split match: a
// whitespace run of a megabyte still splits, and a pattern a crafted
// prompt makes backtrack without end fails (the text is then one piece)
// instead of spinning.
const maxSplitBacktrack = 1 << 20

// splitOptions are the options a split pattern is compiled with. Besides
// the bound, they keep regexp2 from running the code tiktoken-go
// registered for the well-known patterns (GPT-2, cl100k = Llama 3, o200k;
// regexp2.RegisterEngine, keyed by pattern and options): that code
// splits some texts otherwise than a backtracking engine — "\n \n"
// after a digit as two pieces, DEL as none — where tokenizers (Oniguruma)
// and so the engines split as regexp2's interpreter does.
func splitOptions() []regexp2.CompileOption {
	return []regexp2.CompileOption{regexp2.OptionMaxBacktrackingStackSize(maxSplitBacktrack)}
}

// parsePreTokenizer appends raw's split stages to stages; byteLevel is
// set when a ByteLevel is among them.
func parsePreTokenizer(raw json.RawMessage, stages []splitStage, byteLevel *bool) ([]splitStage, error) {
	if isNull(raw) {
		return stages, nil
	}
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	switch c.Type {
	case "Sequence":
		var err error
		for _, p := range c.Pretokenizers {
			if stages, err = parsePreTokenizer(p, stages, byteLevel); err != nil {
				return nil, err
			}
		}
		return stages, nil
	case "ByteLevel":
		*byteLevel = true
		st := splitStage{prefixSpace: c.AddPrefixSpace}
		if c.UseRegex == nil || *c.UseRegex {
			st.re = regexp2.MustCompile(gpt2Split, splitOptions()...) // a constant that compiles
		}
		if st.re == nil && !st.prefixSpace {
			return stages, nil // the byte mapping alone: BPE does it
		}
		return append(stages, st), nil
	case "Split":
		if c.Behavior != "Isolated" || c.Invert {
			return nil, unsupported("pre_tokenizer Split behavior %q invert %v: only Isolated", c.Behavior, c.Invert)
		}
		var pattern string
		switch {
		case c.Pattern.Regex != nil:
			pattern = *c.Pattern.Regex
		case c.Pattern.String != nil && *c.Pattern.String != "":
			pattern = regexp2.Escape(*c.Pattern.String)
		default:
			return nil, unsupported("pre_tokenizer Split without a pattern")
		}
		// regexp2's default (.NET) syntax reads the patterns these files
		// carry (Oniguruma's, with lookahead) as tokenizers does.
		re, err := regexp2.Compile(pattern, splitOptions()...)
		if err != nil {
			return nil, fmt.Errorf("pre_tokenizer Split pattern %q: %w", pattern, err)
		}
		return append(stages, splitStage{re: re}), nil
	}
	return nil, unsupported("pre_tokenizer %q: only ByteLevel, Split and Sequence", c.Type)
}

// checkDecoder wants ByteLevel (or none): a byte-level vocabulary's
// decoder.
func checkDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("decoder: %w", err)
	}
	switch c.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		for _, d := range c.Decoders {
			if err := checkDecoder(d); err != nil {
				return err
			}
		}
		return nil
	}
	return unsupported("decoder %q: only ByteLevel", c.Type)
}

// parsePostProcessor is the ids a TemplateProcessing puts before a single
// sequence ($A); none for other processors (ByteLevel's changes offsets
// only).
func parsePostProcessor(raw json.RawMessage, special map[string]uint32) ([]uint32, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	switch c.Type {
	case "Sequence":
		var ids []uint32
		for _, p := range c.Processors {
			one, err := parsePostProcessor(p, special)
			if err != nil {
				return nil, err
			}
			ids = append(ids, one...)
		}
		return ids, nil
	case "TemplateProcessing":
		var ids []uint32
		for _, raw := range c.Single {
			var piece struct {
				SpecialToken *struct{ ID string } `json:"SpecialToken"`
				Sequence     *struct{ ID string } `json:"Sequence"`
			}
			if err := json.Unmarshal(raw, &piece); err != nil {
				return nil, fmt.Errorf("post_processor single: %w", err)
			}
			if piece.Sequence != nil {
				return ids, nil // what follows the prompt does not key it
			}
			if piece.SpecialToken == nil {
				return nil, unsupported("post_processor single piece %s", raw)
			}
			id, ok := special[piece.SpecialToken.ID]
			if !ok {
				return nil, fmt.Errorf("post_processor special token %q is not an added token", piece.SpecialToken.ID)
			}
			ids = append(ids, id)
		}
		return ids, nil
	}
	return nil, nil
}

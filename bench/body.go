package bench

import (
	"strconv"
	"unicode/utf8"
)

// appendRequestBody appends the JSON body of one streaming request: the
// completions form ({"prompt": …}) or, for chat, one user message. It asks
// for usage in the stream (stream_options.include_usage) so output tokens
// are exact, as vllm bench does.
func appendRequestBody(b []byte, chat bool, model, prompt string, maxTokens int, ignoreEOS bool) []byte {
	b = append(b, `{"model":`...)
	b = appendJSONString(b, model)
	if chat {
		b = append(b, `,"messages":[{"role":"user","content":`...)
		b = appendJSONString(b, prompt)
		b = append(b, `}]`...)
	} else {
		b = append(b, `,"prompt":`...)
		b = appendJSONString(b, prompt)
	}
	b = append(b, `,"max_tokens":`...)
	b = strconv.AppendInt(b, int64(maxTokens), 10)
	b = append(b, `,"stream":true,"stream_options":{"include_usage":true}`...)
	if ignoreEOS {
		b = append(b, `,"ignore_eos":true`...)
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string literal; invalid UTF-8 becomes
// U+FFFD, as encoding/json does.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

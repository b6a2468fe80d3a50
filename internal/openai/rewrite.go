package openai

import "github.com/tidwall/sjson"

// What the router changes in a request body before it goes upstream: the
// usage chunk it needs asked for, the pool's output cap applied, a member
// put first (withTokenIDs, migrate.go). Each follows what parseRequest
// found (request.go).

// WithIncludeUsage returns body with stream_options.include_usage set to
// true, so the router sees exact token counts in the stream's usage chunk.
// A body without stream_options (the usual case) gets it as its first
// member, one copy: sjson would search the whole body for the key first
// and allocate three times, 3.8–4.0 µs for an 8 KB prompt against 2.8–3.0
// (BenchmarkIncludeUsage; most of what is left is the new body itself).
func WithIncludeUsage(body []byte, r *Request) ([]byte, error) {
	switch {
	case r.hasOptions:
		return sjson.SetBytes(body, "stream_options.include_usage", true)
	case !r.optionsKey:
		if out, ok := WithFirstMember(make([]byte, 0, len(body)+len(includeUsageMember)+1), body, includeUsageMember); ok {
			return out, nil
		}
	}
	return sjson.SetRawBytes(body, "stream_options", []byte(`{"include_usage":true}`)) // stream_options: null
}

const includeUsageMember = `"stream_options":{"include_usage":true}`

// WithFirstMember appends body with member (`"key":value`) added as its
// first member to dst; false when body is not an object. The caller knows
// the key is not in body already: an engine reads the last of a repeated
// key.
func WithFirstMember(dst, body []byte, member string) ([]byte, bool) {
	i := 0
	for i < len(body) && body[i] != '{' {
		if !isJSONSpace(body[i]) {
			return dst, false
		}
		i++
	}
	if i == len(body) {
		return dst, false
	}
	dst = append(dst, body[:i+1]...)
	dst = append(dst, member...)
	rest := body[i+1:]
	j := 0
	for j < len(rest) && isJSONSpace(rest[j]) {
		j++
	}
	if j < len(rest) && rest[j] != '}' {
		dst = append(dst, ',')
	}
	return append(dst, rest...), true
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// ClampOutput applies a pool's output cap (limit > 0) to the request and
// its body: each output-limit key above the cap, or null, is rewritten to
// it, and a body naming neither gets max_tokens: limit. It updates
// r.maxTokens and reports whether the cap lowered it (or set one where
// the client gave none) — then the client is told, in a header. An
// explicit 0 stays in the body (the engine refuses it) but counts as the
// cap for the router's estimate.
func (r *Request) ClampOutput(body []byte, limit int) ([]byte, bool, error) {
	var err error
	for i, k := range r.limits {
		if k.given && (k.null || int(k.n) > limit) {
			if body, err = sjson.SetBytes(body, outputKeyName(i), limit); err != nil {
				return body, false, err
			}
		}
	}
	if !r.limits[0].given && !r.limits[1].given {
		if body, err = sjson.SetBytes(body, outputKeyName(0), limit); err != nil {
			return body, false, err
		}
	}
	if r.MaxTokens == 0 || r.MaxTokens > limit {
		r.MaxTokens = limit
		return body, true, nil
	}
	return body, false, nil
}

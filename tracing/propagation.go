package tracing

import (
	"bytes"
	"context"
	"encoding/hex"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// W3C Trace Context header names (https://www.w3.org/TR/trace-context/).
const (
	TraceparentHeader = "traceparent"
	TracestateHeader  = "tracestate"
)

// HeaderGetter is what the router reads a client's trace context from;
// *fasthttp.RequestHeader is one.
type HeaderGetter interface {
	Peek(key string) []byte
}

// HeaderSetter is what the router writes an engine request's trace
// context into; *fasthttp.RequestHeader is one.
type HeaderSetter interface {
	SetBytesV(key string, value []byte)
	Del(key string)
}

// IsTraceHeader reports whether the header named name (any case) carries
// trace context. While tracing is on the router writes these itself, so a
// request path that copies a client's headers to the engine skips them
// (the request loop writes header lines, which a later Set cannot
// replace); off, they pass through untouched and the engine continues the
// client's trace.
func IsTraceHeader(name []byte) bool {
	return (len(name) == len(TraceparentHeader) && bytes.EqualFold(name, []byte(TraceparentHeader))) ||
		(len(name) == len(TracestateHeader) && bytes.EqualFold(name, []byte(TracestateHeader)))
}

// RemoteSpanContext is the trace context a client sent in h (traceparent,
// and tracestate with it), as the W3C propagator reads it; invalid when
// none came or it does not parse. A traceparent of a later version is
// read as the specification says (its first fields); only the first
// tracestate header is read.
func RemoteSpanContext(h HeaderGetter) trace.SpanContext {
	return trace.SpanContextFromContext(extract(h))
}

// extract is a context holding h's remote span context, for starting the
// request span under it; context.Background() when h has none.
func extract(h HeaderGetter) context.Context {
	ctx := context.Background()
	if h == nil || len(h.Peek(TraceparentHeader)) == 0 {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, headerCarrier{h})
}

// headerCarrier lets the W3C propagator read a HeaderGetter.
type headerCarrier struct{ h HeaderGetter }

func (c headerCarrier) Get(key string) string { return string(c.h.Peek(key)) }
func (c headerCarrier) Set(string, string)    {} // extract only
func (c headerCarrier) Keys() []string        { return []string{TraceparentHeader, TracestateHeader} }

// traceparentLen is the length of a version-00 traceparent value.
const traceparentLen = 2 + 1 + 32 + 1 + 16 + 1 + 2

// appendTraceparent appends sc as a version-00 traceparent value, as the
// W3C propagator writes it (writtenFlags only), without allocating.
func appendTraceparent(dst []byte, sc trace.SpanContext) []byte {
	tid, sid := sc.TraceID(), sc.SpanID()
	dst = append(dst, "00-"...)
	dst = hex.AppendEncode(dst, tid[:])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, sid[:])
	flags := [1]byte{byte(sc.TraceFlags() & writtenFlags)}
	return hex.AppendEncode(append(dst, '-'), flags[:])
}

// writtenFlags are the trace flags the W3C propagator writes: sampled,
// and random (the trace id's random part, Trace Context level 2).
const writtenFlags = trace.FlagsSampled | trace.FlagsRandom

// inject writes a traceparent value and a tracestate one (nil: none)
// into h (a client's tracestate is removed when there is none, so none
// reaches the engine beside a traceparent it does not belong to).
func inject(h HeaderSetter, traceparent, tracestate []byte) {
	h.SetBytesV(TraceparentHeader, traceparent)
	if len(tracestate) > 0 {
		h.SetBytesV(TracestateHeader, tracestate)
	} else {
		h.Del(TracestateHeader)
	}
}

// appendHeaderLines appends sc and tracestate (nil: none) as HTTP/1.1
// header lines: "traceparent: ...\r\n", and "tracestate: ...\r\n".
func appendHeaderLines(dst []byte, sc trace.SpanContext, tracestate []byte) []byte {
	dst = append(dst, TraceparentHeader+": "...)
	dst = append(appendTraceparent(dst, sc), "\r\n"...)
	if len(tracestate) > 0 {
		dst = append(dst, TracestateHeader+": "...)
		dst = append(append(dst, tracestate...), "\r\n"...)
	}
	return dst
}

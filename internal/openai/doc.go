// Package openai reads and rewrites what the OpenAI-compatible API carries,
// in its bytes, for the router: a request's body parsed once into what
// routing needs (ReadRequest: model, stream, output limits, prompt size,
// prefix hash, what a continuation needs), its rewrites (an output cap,
// stream_options.include_usage), the strict JSON check every body passes
// (CheckJSON) and the member scan that reads one member without a parse
// tree (EachMember, ObjectMembers), a stream's events and what each is
// (NextEvent, ClassifyEvent: a chunk with output counts for TTFT), and a
// chunk's fields found and edited in place (Field, Edits). Nothing here
// does I/O or keeps state between calls; its errors wrap ErrBadRequest.
package openai

package proxy

import (
	"io"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/internal/openai"
)

// chunkedBody feeds data to the relay in pieces of the given sizes, then
// EOF, like a network stream would.
type chunkedBody struct {
	data  []byte
	sizes []byte
	i     int
}

func (c *chunkedBody) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := len(c.data)
	if len(c.sizes) > 0 {
		n = int(c.sizes[c.i%len(c.sizes)]) + 1
		c.i++
	}
	n = min(n, len(p), len(c.data))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func (c *chunkedBody) CloseWithError(error) error { return nil }

func FuzzSSERelay(f *testing.F) {
	chunk := "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
	usage := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n"
	f.Add([]byte(chunk+chunk+usage+"data: [DONE]\n\n"), []byte{3, 7}, true)
	f.Add([]byte(chunk+chunk), []byte{}, false)
	f.Add([]byte("data: {\"error\":{\"message\":\"boom\"}}\n\ndata: [DONE]\n\n"), []byte{1}, false)
	f.Add([]byte(": keep-alive\r\n\r\ndata: [DONE]\r\n\r\ndata: after\n\n"), []byte{0}, true)
	f.Fuzz(func(t *testing.T, data, sizes []byte, strip bool) {
		s := &Server{cfg: Config{}.withDefaults(), now: time.Now}
		x := &exchange{s: s, received: time.Now()}
		buf := make([]byte, 0, 64)
		r := &relay{x: x, body: &chunkedBody{data: data, sizes: sizes}, strip: strip, buf: buf, in: buf[:0]}
		out, err := io.ReadAll(io.LimitReader(r, int64(len(data))+1<<16))
		if err != nil {
			t.Fatal(err)
		}
		var dones, events int
		var last []byte
		for rest := out; len(rest) > 0; {
			k := openai.NextEvent(rest)
			if k < 0 {
				t.Fatalf("relay output ends mid-event: %q", rest)
			}
			last = openai.EventData(rest[:k])
			if string(last) == openai.DonePayload {
				dones++
			}
			events++
			rest = rest[k:]
		}
		if dones != 1 || string(last) != openai.DonePayload {
			t.Fatalf("relay output must end with exactly one [DONE] (%d in %d events): %q", dones, events, out)
		}
		if !r.sawDone && r.failure == nil {
			t.Fatal("stream without [DONE] not marked as failed")
		}
		if r.sawDone && r.failure == nil && len(out) > len(data) {
			t.Fatalf("clean relay grew the stream: %d > %d", len(out), len(data))
		}
		if x.itlCount != max(x.tokenChunks-1, 0) {
			t.Fatalf("itl gaps %d for %d token chunks", x.itlCount, x.tokenChunks)
		}
	})
}

package proxy

import (
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

// parseRequest is readRequest with a parser of its own, for tests.
func parseRequest(body []byte, ep endpoint) (request, error) {
	var p fastjson.Parser
	return readRequest(&p, body, ep)
}

// A body nested deeper than the parser goes is valid JSON but refused
// with the depth named, not read as malformed; one at the limit is read.
func TestReadRequestDepth(t *testing.T) {
	nested := func(depth int) []byte {
		return []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":` +
			strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`)
	}
	var p fastjson.Parser
	if _, err := readRequest(&p, nested(fastjson.MaxDepth-2), epChat); err != nil {
		t.Fatalf("%d levels: %v", fastjson.MaxDepth-1, err)
	}
	_, err := readRequest(&p, nested(fastjson.MaxDepth), epChat)
	if err == nil || statusOf(err) != 400 || !strings.Contains(err.Error(), "nested more than 300 levels deep") {
		t.Fatalf("%d levels: %v, want a 400 naming the depth", fastjson.MaxDepth+1, err)
	}
	// The parser serves the next body after a refusal.
	r, err := readRequest(&p, []byte(`{"model":"x","prompt":"abcd"}`), epCompletions)
	if err != nil || r.model != "x" || r.promptBytes != 4 {
		t.Fatalf("next body: %+v, %v", r, err)
	}
}

package openai

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

// parseRequest is ReadRequest with a parser of its own, for tests.
func parseRequest(body []byte, ep Endpoint) (Request, error) {
	var p fastjson.Parser
	return ReadRequest(&p, body, ep)
}

// A body nested deeper than the parser goes is valid JSON but refused
// with the depth named, not read as malformed; one at the limit is read.
func TestReadRequestDepth(t *testing.T) {
	nested := func(depth int) []byte {
		return []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":` +
			strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`)
	}
	var p fastjson.Parser
	if _, err := ReadRequest(&p, nested(fastjson.MaxDepth-2), Chat); err != nil {
		t.Fatalf("%d levels: %v", fastjson.MaxDepth-1, err)
	}
	_, err := ReadRequest(&p, nested(fastjson.MaxDepth), Chat)
	if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "nested more than 300 levels deep") {
		t.Fatalf("%d levels: %v, want a 400 naming the depth", fastjson.MaxDepth+1, err)
	}
	// The parser serves the next body after a refusal.
	r, err := ReadRequest(&p, []byte(`{"model":"x","prompt":"abcd"}`), Completions)
	if err != nil || r.Model != "x" || r.PromptBytes != 4 {
		t.Fatalf("next body: %+v, %v", r, err)
	}
}

// A body's values cost the router no parse tree unless it reads them: a
// member it does not read and a prompt of token ids are passed over in
// their bytes, and a member it reads may hold MaxTreeValues values. Parsed
// whole, 8 MiB of "[0,0,…]" under an unread key took 2 GB of heap.
func TestReadRequestManyValues(t *testing.T) {
	const n = 4 << 20
	zeros := "[" + strings.Repeat("0,", n-1) + "0]"
	allocated := func(f func()) uint64 {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		f()
		runtime.ReadMemStats(&m1)
		return m1.TotalAlloc - m0.TotalAlloc
	}
	var p fastjson.Parser
	var r Request
	var err error
	if a := allocated(func() {
		r, err = ReadRequest(&p, []byte(`{"model":"m","metadata":`+zeros+`,"prompt":"hi"}`), Completions)
	}); err != nil || r.PromptBytes != 2 || a > 64<<20 {
		t.Errorf("an unread member of %d values: %+v, %v, %d MB allocated", n, r, err, a>>20)
	}
	if a := allocated(func() {
		r, err = ReadRequest(&p, []byte(`{"model":"m","prompt":`+zeros+`}`), Completions)
	}); err != nil || r.PromptBytes != 4*n || r.Cont != ContPromptIDs || a > 64<<20 {
		t.Errorf("a prompt of %d token ids: %+v, %v, %d MB allocated", n, r, err, a>>20)
	}
	if r, err = ReadRequest(&p, []byte(`{"input":[[1,2],[3]]}`), Embeddings); err != nil || r.PromptBytes != 12 {
		t.Errorf("token ids, several inputs: %+v, %v", r, err)
	}
	many := `{"model":"m","messages":[{"role":"user","content":[` + strings.Repeat(`{"type":"text","text":"a"},`, MaxTreeValues/3) + `{"type":"text","text":"a"}]}]}`
	_, err = ReadRequest(&p, []byte(many), Chat)
	if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "messages: more than 65536 JSON values in the body") {
		t.Errorf("messages of over %d values: %v, want a 400 naming them", MaxTreeValues, err)
	}
	// The bound is the body's, however a member repeats.
	part := `{"role":"user","content":[` + strings.Repeat(`{"type":"text","text":"a"},`, MaxTreeValues/6) + `{"type":"text","text":"a"}]}`
	if _, err = ReadRequest(&p, []byte(`{"model":"m","messages":[`+part+`]}`), Chat); err != nil {
		t.Errorf("messages of half the bound's values: %v", err)
	}
	thrice := `{"model":"m","messages":[` + part + `],"messages":[` + part + `],"messages":[` + part + `]}`
	if _, err = ReadRequest(&p, []byte(thrice), Chat); !errors.Is(err, ErrBadRequest) {
		t.Errorf("three such members: %v, want a 400", err)
	}
}

// A member of more than PooledTreeValues values is parsed by a parser of
// its own: the pooled one, which keeps its tree's memory for its next
// body, is left as it was (a tree it made earlier still reads).
func TestReadRequestBigTreeNotPooled(t *testing.T) {
	var p fastjson.Parser
	before, err := p.Parse(`{"a":[1,2,3],"b":"x"}`)
	if err != nil {
		t.Fatal(err)
	}
	prompts := `["a"` + strings.Repeat(`,"a"`, PooledTreeValues) + `]`
	r, err := ReadRequest(&p, []byte(`{"prompt":`+prompts+`}`), Completions)
	if err != nil || r.PromptBytes != PooledTreeValues+1 {
		t.Fatalf("%+v, %v", r, err)
	}
	if got := before.String(); got != `{"a":[1,2,3],"b":"x"}` {
		t.Errorf("the pooled parser's earlier tree reads %s: it parsed the large member", got)
	}
}

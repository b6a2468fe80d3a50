package bench

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestParseSSELine(t *testing.T) {
	tests := []struct {
		name      string
		line      string
		anyChoice bool
		want      chunk
	}{
		{"chat content", `data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`, false, chunk{chunkToken, -1, -1}},
		{"chat role only", `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, false, chunk{chunkOther, -1, -1}},
		{"chat role only, vllm counting", `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, true, chunk{chunkToken, -1, -1}},
		{"null content", `data: {"choices":[{"delta":{"content":null},"finish_reason":"stop"}]}`, false, chunk{chunkOther, -1, -1}},
		{"completions text", `data: {"choices":[{"index":0,"text":" the","logprobs":null}]}`, false, chunk{chunkToken, -1, -1}},
		{"spaces around colons", `data:{"choices": [{"delta": {"content" : "x"}}]}`, false, chunk{chunkToken, -1, -1}},
		{"reasoning", `data: {"choices":[{"delta":{"reasoning_content":"hmm"}}]}`, false, chunk{chunkToken, -1, -1}},
		{"key inside a value does not count", `data: {"choices":[{"delta":{"content":"","x":"\"content\":\"y"}}]}`, false, chunk{chunkOther, -1, -1}},
		{"usage only", `data: {"choices":[],"usage":{"prompt_tokens":12,"total_tokens":40,"completion_tokens":28}}`, false, chunk{chunkOther, 28, 12}},
		{"usage only, vllm counting", `data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":28}}`, true, chunk{chunkOther, 28, 12}},
		{"usage null", `data: {"choices":[{"text":"a"}],"usage":null}`, false, chunk{chunkToken, -1, -1}},
		{"continuous usage", `data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`, false, chunk{chunkToken, 1, 3}},
		{"done", "data: [DONE]", false, chunk{chunkDone, -1, -1}},
		{"done with CR", "data: [DONE]\r", false, chunk{chunkDone, -1, -1}},
		{"error nested", `data: {"error":{"message":"boom","code":500}}`, false, chunk{chunkError, -1, -1}},
		{"error flat", `data: {"object":"error","message":"boom"}`, false, chunk{chunkError, -1, -1}},
		{"comment", ": ping", false, chunk{chunkOther, -1, -1}},
		{"event line", "event: message", false, chunk{chunkOther, -1, -1}},
		{"blank", "", false, chunk{chunkOther, -1, -1}},
		{"empty data", "data:", false, chunk{chunkOther, -1, -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseSSELine([]byte(tt.line), tt.anyChoice); got != tt.want {
				t.Fatalf("parseSSELine(%q) = %+v, want %+v", tt.line, got, tt.want)
			}
		})
	}
}

func TestLineReader(t *testing.T) {
	long := strings.Repeat("x", 10000)
	tests := []struct {
		name    string
		in      string
		wrap    func(io.Reader) io.Reader
		max     int
		want    []string
		wantErr error
	}{
		{"lines", "a\nbb\n\nccc\n", nil, 1 << 20, []string{"a", "bb", "", "ccc"}, io.EOF},
		{"unterminated last line dropped", "a\nbb", nil, 1 << 20, []string{"a"}, io.EOF},
		{"one byte reads", "data: x\n\ndata: [DONE]\n\n", iotest.OneByteReader, 1 << 20, []string{"data: x", "", "data: [DONE]", ""}, io.EOF},
		{"data with EOF", "a\nb\n", iotest.DataErrReader, 1 << 20, []string{"a", "b"}, io.EOF},
		{"grows for long lines", long + "\nz\n", nil, 1 << 20, []string{long, "z"}, io.EOF},
		{"too long", long + "\n", nil, 4096, nil, errLineTooLong},
		{"read error", "a\n", func(r io.Reader) io.Reader { return io.MultiReader(r, iotest.ErrReader(io.ErrUnexpectedEOF)) }, 1 << 20, []string{"a"}, io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r io.Reader = strings.NewReader(tt.in)
			if tt.wrap != nil {
				r = tt.wrap(r)
			}
			lr := newLineReader(r, make([]byte, 16), tt.max)
			var got []string
			var err error
			for {
				var line []byte
				line, err = lr.next()
				if err != nil {
					break
				}
				got = append(got, string(line))
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Fatalf("lines %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLineReaderNoProgress(t *testing.T) {
	lr := newLineReader(zeroReader{}, make([]byte, 16), 64)
	if _, err := lr.next(); !errors.Is(err, io.ErrNoProgress) {
		t.Fatalf("err = %v, want io.ErrNoProgress", err)
	}
}

type zeroReader struct{}

func (zeroReader) Read([]byte) (int, error) { return 0, nil }

func BenchmarkParseSSELine(b *testing.B) {
	lines := [][]byte{
		[]byte(`data: {"id":"chatcmpl-8a7f","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen2.5-7B-Instruct","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`),
		[]byte(`data: {"id":"cmpl-8a7f","object":"text_completion","created":1718000000,"model":"Qwen/Qwen2.5-7B-Instruct","choices":[{"index":0,"text":" token","logprobs":null,"finish_reason":null,"stop_reason":null}]}`),
		[]byte(""),
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		parseSSELine(lines[i%len(lines)], false)
	}
}

// FuzzParseSSELine checks the scanner never panics and agrees with itself:
// a line is never both a token and a terminal event, and usage counts are
// -1 or non-negative.
func FuzzParseSSELine(f *testing.F) {
	for _, s := range []string{
		`data: {"choices":[{"delta":{"content":"Hi"}}]}`,
		`data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
		"data: [DONE]", `data: {"error":{"message":"x"}}`, ": ping", "data:", `data: {"content":`, `data: {"usage":{"completion_tokens":99999999999999999999}}`,
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, line []byte, anyChoice bool) {
		c := parseSSELine(line, anyChoice)
		if c.completionTokens < -1 || c.promptTokens < -1 {
			t.Fatalf("negative usage %+v", c)
		}
		if !bytes.HasPrefix(line, []byte("data:")) && c.kind != chunkOther {
			t.Fatalf("non-data line classified %v", c.kind)
		}
	})
}

// FuzzLineReader splits arbitrary input at arbitrary read sizes and checks
// the lines equal a plain split of the terminated part.
func FuzzLineReader(f *testing.F) {
	f.Add([]byte("data: a\n\ndata: [DONE]\n\n"), uint8(1))
	f.Add([]byte("x\r\ny"), uint8(3))
	f.Fuzz(func(t *testing.T, in []byte, step uint8) {
		r := &chunkedReader{b: in, step: int(step%17) + 1}
		lr := newLineReader(r, make([]byte, 4), 1<<20)
		var got [][]byte
		for {
			line, err := lr.next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
				break
			}
			got = append(got, append([]byte(nil), line...))
		}
		var want [][]byte
		if i := bytes.LastIndexByte(in, '\n'); i >= 0 {
			want = bytes.Split(in[:i], []byte("\n"))
		}
		if len(got) != len(want) {
			t.Fatalf("%d lines, want %d", len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("line %d = %q, want %q", i, got[i], want[i])
			}
		}
	})
}

type chunkedReader struct {
	b    []byte
	step int
}

func (r *chunkedReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.step)], r.b)
	r.b = r.b[n:]
	return n, nil
}

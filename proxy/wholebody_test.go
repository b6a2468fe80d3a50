package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// heldLog is a log sink whose access log lines wait until release is
// closed: a router writing one before its answer would hold the answer.
type heldLog struct {
	release chan struct{}
	lockedBuffer
}

func (h *heldLog) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"msg":"request"`)) {
		<-h.release
	}
	return h.lockedBuffer.Write(p)
}

// A whole answer reaches the client before the exchange is accounted
// for (wholeBody): with the access log's write held, the client still
// has its answer; once it is let go, the line, the record and the usage
// are there.
func TestWholeAnswerBeforeAccounting(t *testing.T) {
	up := newFakeVLLM(t)
	logs := &heldLog{release: make(chan struct{})}
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	log := zap.New(zapcore.NewCore(enc, zapcore.AddSync(logs), zapcore.InfoLevel))
	tr := startRouterWith(t, []string{up.url}, func(o *Options) { o.Logger = log })
	released := false
	defer func() {
		if !released {
			close(logs.release)
		}
	}()

	got := make(chan string, 1)
	go func() {
		resp, err := http.Post(tr.url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`))
		if err != nil {
			got <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- resp.Status + " " + string(b)
	}()
	var answer string
	select {
	case answer = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no answer while the access log's write was held")
	}
	if !strings.HasPrefix(answer, "200 ") || !strings.Contains(answer, `"usage"`) {
		t.Fatalf("answer %q", answer)
	}
	if tr.srv.Active() != 1 {
		t.Errorf("%d requests in flight while the log line waits; want 1 (not finished yet)", tr.srv.Active())
	}
	close(logs.release)
	released = true
	waitFor(t, "the request finished", func() bool { return tr.srv.Active() == 0 })
	line := logs.String()
	if !strings.Contains(line, `"outcome":"ok"`) || !strings.Contains(line, `"completion_tokens":5`) {
		t.Errorf("access log %s", line)
	}
	recs := tr.srv.records.Since(0, 0)
	if len(recs) != 1 || recs[0].Outcome != "ok" || recs[0].CompletionTokens != 5 {
		t.Errorf("records %+v", recs)
	}
}

// An engine's 200 nested too deep to check is a malformed answer (502),
// not the end of the router.
func TestWholeAnswerNestedTooDeep(t *testing.T) {
	const n = 2 << 20
	deep := strings.Repeat("[", n) + strings.Repeat("]", n)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, deep) //nolint:errcheck
	}))
	defer up.Close()
	tr := startRouter(t, []string{up.URL})
	for range 2 { // and the router still answers
		resp := post(t, tr.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "malformed JSON") {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	}
}

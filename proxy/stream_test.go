package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Events must reach the client while the upstream is still streaming: the
// fake sends token i+1 only after the client has received token i, so a
// buffering relay would deadlock (the fake then fails the test).
func TestStreamRelaysEachEventBeforeTheNextIsSent(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens = 5
	up.lockstep = make(chan int)
	tr := startRouter(t, []string{up.url})

	resp := post(t, tr.url+"/v1/chat/completions", chatStream)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	var recvTimes []time.Time
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			break
		}
		if !strings.HasPrefix(line, "data: ") || !strings.Contains(line, `"content":"tok`) {
			continue
		}
		recvTimes = append(recvTimes, time.Now())
		i := len(recvTimes) - 1
		if i < up.tokens {
			up.lockstep <- i
		}
	}
	if len(recvTimes) != up.tokens {
		t.Fatalf("client got %d token events, want %d", len(recvTimes), up.tokens)
	}
	up.sendTimeMu.Lock()
	defer up.sendTimeMu.Unlock()
	for i := 0; i+1 < len(recvTimes); i++ {
		if !recvTimes[i].Before(up.sendTimes[i+1]) {
			t.Errorf("event %d reached the client at %v, after upstream sent event %d at %v", i, recvTimes[i], i+1, up.sendTimes[i+1])
		}
	}
}

func TestClientDisconnectAbortsUpstream(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		prefill time.Duration
		gap     time.Duration
		readN   int // token events the client reads before hanging up
	}{
		{"during prefill, nothing written yet", chatStream, time.Minute, 0, 0},
		{"during decode", chatStream, 0, 5 * time.Millisecond, 3},
		// The engine answers a non-streamed request only when done: no
		// response has started when the client leaves.
		{"non-streamed, while the engine generates", chatPlain, time.Minute, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newFakeVLLM(t)
			up.tokens = 100000
			up.prefill, up.gap = tt.prefill, tt.gap
			tr := startRouter(t, []string{up.url})

			conn, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
				itoa(len(tt.body))+"\r\n\r\n"+tt.body)
			select {
			case <-up.received:
			case <-time.After(5 * time.Second):
				t.Fatal("upstream never got the request")
			}
			br := bufio.NewReader(conn)
			for n := 0; n < tt.readN; {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(line, `"content":"tok`) {
					n++
				}
			}
			conn.Close()
			waitFor(t, "upstream to see the cancellation", func() bool { return up.canceled.Load() == 1 })
			waitFor(t, "router to finish the request", func() bool { return tr.srv.Active() == 0 })
			if n := tr.reps[0].InFlight(); n != 0 {
				t.Errorf("replica in-flight = %d after cancel", n)
			}
			ps := &tr.srv.routes.Load().upstreams[tr.reps[0]].pending
			for i := range ps.shards {
				for seq := range ps.shards[i].m {
					t.Errorf("request %v still pending on the upstream after it ended", seq)
				}
			}
			if got := tr.reps[0].BreakerState(); got != "closed" {
				t.Errorf("a client cancel counted against the replica: breaker %s", got)
			}
			recs := tr.srv.records.Since(0, 0)
			if len(recs) != 1 || recs[0].Outcome != "canceled" {
				t.Errorf("records = %+v, want one canceled", recs)
			}
		})
	}
}

// Two requests that carry the same client-chosen X-Request-Id are each
// aborted when their own client leaves: the router finds a request's
// upstream connection by its own number, not by the client's id.
func TestClientDisconnectAbortsUpstreamDuplicateID(t *testing.T) {
	up := newFakeVLLM(t)
	up.prefill = time.Minute // the engine answers neither on its own
	tr := startRouter(t, []string{up.url})
	var conns []net.Conn
	for range 2 {
		conn, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: same-id\r\nContent-Type: application/json\r\nContent-Length: "+
			itoa(len(chatPlain))+"\r\n\r\n"+chatPlain)
		select {
		case r := <-up.received:
			if got := r.Header.Get("X-Request-Id"); got != "same-id" {
				t.Fatalf("upstream got X-Request-Id %q, want the client's", got)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("upstream never got the request")
		}
		conns = append(conns, conn)
	}
	for i, conn := range conns {
		conn.Close()
		waitFor(t, "upstream to see the cancellation", func() bool { return up.canceled.Load() == int64(i+1) })
	}
	waitFor(t, "router to finish both requests", func() bool { return tr.srv.Active() == 0 })
}

func TestStreamCutWithoutDoneReachesClientAsErrorEvent(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens, up.cutAfter = 10, 3
	tr := startRouter(t, []string{up.url})
	resp := post(t, tr.url+"/v1/chat/completions", chatStream)
	defer resp.Body.Close()
	evs := sseEvents(t, resp.Body)
	if len(evs) < 2 {
		t.Fatalf("events: %q", evs)
	}
	last, errEv := evs[len(evs)-1], evs[len(evs)-2]
	if last != "[DONE]" {
		t.Errorf("last event %q, want [DONE]", last)
	}
	var e struct {
		Error struct{ Message, Type, Code string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(errEv), &e); err != nil || e.Error.Code != "bad_upstream" {
		t.Errorf("error event %q (%v), want an OpenAI error with code bad_upstream", errEv, err)
	}
	waitFor(t, "finish", func() bool { return tr.srv.Active() == 0 })
	if recs := tr.srv.records.Since(0, 0); len(recs) != 1 || recs[0].Outcome != "broken_stream" {
		t.Errorf("records = %+v, want broken_stream", recs)
	}
}

func TestUsageInjectedAndHidden(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens = 4
	tr := startRouter(t, []string{up.url})

	t.Run("client did not ask", func(t *testing.T) {
		resp := post(t, tr.url+"/v1/chat/completions", chatStream)
		evs := sseEvents(t, resp.Body)
		resp.Body.Close()
		body := <-up.bodies
		if !strings.Contains(string(body), `"include_usage":true`) {
			t.Errorf("upstream body lacks include_usage: %s", body)
		}
		for _, e := range evs {
			if strings.Contains(e, `"usage"`) {
				t.Errorf("client saw the injected usage chunk: %s", e)
			}
		}
		waitFor(t, "finish", func() bool { return tr.srv.Active() == 0 })
		recs := tr.srv.records.Since(0, 0)
		if got := recs[len(recs)-1]; got.CompletionTokens != 4 || got.PromptTokens != 7 {
			t.Errorf("router counted %d/%d tokens, want 7 prompt / 4 completion", got.PromptTokens, got.CompletionTokens)
		}
	})
	t.Run("client asked", func(t *testing.T) {
		resp := post(t, tr.url+"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
		evs := sseEvents(t, resp.Body)
		resp.Body.Close()
		<-up.bodies
		if len(evs) < 2 || !strings.Contains(evs[len(evs)-2], `"completion_tokens":4`) {
			t.Errorf("client asked for usage and did not get it: %q", evs)
		}
	})
}

func itoa(n int) string { return strings.TrimSpace(strings.Repeat(" ", 0) + jsonNumber(n)) }

func jsonNumber(n int) string { b, _ := json.Marshal(n); return string(b) }

var _ = http.StatusOK

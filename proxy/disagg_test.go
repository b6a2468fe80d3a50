package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/prefixcache"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Prefill/decode disaggregation (disagg.go) against hand-written engines:
// the bodies of both steps, where each goes, and what a failure does.

// pdGolden is one of the exchange's documents, shared with the simulator
// (bench/sim/testdata/golden/pd: vLLM's shapes, with their sources).
func pdGolden(t *testing.T, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "bench", "sim", "testdata", "golden", "pd", name))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// pdEngine is a hand-written vLLM replica: it keeps every request body
// and answers as a NixlConnector replica would — a prefill request (its
// kv_transfer_params ask do_remote_decode) whole, with kv, anything else
// as a short stream (or whole when not streamed). status, when set, is
// what it answers instead; hold keeps a prefill until the client leaves.
type pdEngine struct {
	srv    *httptest.Server
	kv     json.RawMessage
	status int
	hold   bool
	delay  time.Duration // each prefill's

	prefilling, maxPrefilling atomic.Int32 // prefills in progress, and their most at once
	overlapped                atomic.Int32 // prefills started while another was in progress

	mu      sync.Mutex
	bodies  []map[string]any
	aborted int // held prefills whose connection closed
}

func newPDEngine(t *testing.T, kv json.RawMessage) *pdEngine {
	e := &pdEngine{kv: kv}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *pdEngine) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var body map[string]any
	json.Unmarshal(b, &body) //nolint:errcheck
	e.mu.Lock()
	e.bodies = append(e.bodies, body)
	status, hold := e.status, e.hold
	e.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
		return
	}
	kv, _ := body["kv_transfer_params"].(map[string]any)
	if kv["do_remote_decode"] == true {
		if hold {
			select {
			case <-r.Context().Done():
				e.mu.Lock()
				e.aborted++
				e.mu.Unlock()
			case <-time.After(10 * time.Second):
			}
			return
		}
		n := e.prefilling.Add(1)
		if n > 1 {
			e.overlapped.Add(1)
		}
		for m := e.maxPrefilling.Load(); n > m && !e.maxPrefilling.CompareAndSwap(m, n); m = e.maxPrefilling.Load() {
		}
		time.Sleep(e.delay)
		e.prefilling.Add(-1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-p","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"A"},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10},"kv_transfer_params":%s}`, e.kv)
		return
	}
	if body["stream"] != true {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"whole"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`) //nolint:errcheck
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, tok := range []string{"one", " two", " three"} {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-d\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", tok)
	}
	io.WriteString(w, "data: {\"id\":\"chatcmpl-d\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\ndata: [DONE]\n\n") //nolint:errcheck
}

func (e *pdEngine) seen() []map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]map[string]any(nil), e.bodies...)
}

// remoteAsked counts the requests e got that ask for a remote prefill or
// decode.
func (e *pdEngine) remoteAsked() (prefill, decode int) {
	for _, b := range e.seen() {
		kv, _ := b["kv_transfer_params"].(map[string]any)
		if kv["do_remote_prefill"] == true {
			prefill++
		}
		if kv["do_remote_decode"] == true {
			decode++
		}
	}
	return prefill, decode
}

// withSplit makes the first np replicas of the route's pool its prefill
// replicas and the next nd its decode replicas (the rest colocated),
// splitting prompts of minTokens or more.
func withSplit(np, nd, minTokens int) func(*Options) {
	return func(o *Options) {
		reps := o.Routes[0].Pool.Replicas()
		sp := NewSplit(reps[:np], reps[np:np+nd], &balancer.RoundRobin{})
		sp.MinPromptTokens = minTokens
		o.Routes[0].Split = sp
	}
}

// pdClientBody is the golden exchange's client request: the decode
// request without its kv_transfer_params.
func pdClientBody(t *testing.T) []byte {
	v := pdGolden(t, "decode_request.json")
	delete(v, "kv_transfer_params")
	b, _ := json.Marshal(v)
	return b
}

func postPD(t *testing.T, url string, body []byte) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The router's two requests are vLLM's documented shapes (the golden
// documents): the prefill request as vLLM's proxy builds it, then the
// client's request with the prefill answer's kv_transfer_params verbatim;
// the client gets the decode replica's stream.
func TestSplitExchangeIsVLLMs(t *testing.T) {
	kv, _ := json.Marshal(pdGolden(t, "prefill_response_kv_transfer_params.json"))
	p, d := newPDEngine(t, kv), newPDEngine(t, kv)
	tr := startRouterWith(t, []string{p.srv.URL, d.srv.URL}, withSplit(1, 1, 1))
	status, out := postPD(t, tr.url, pdClientBody(t))
	if status != 200 || !strings.Contains(out, "three") || !strings.HasSuffix(out, "data: [DONE]\n\n") {
		t.Fatalf("client got %d %q", status, out)
	}
	pb, db := p.seen(), d.seen()
	if len(pb) != 1 || len(db) != 1 {
		t.Fatalf("prefill replica got %d requests, decode replica %d: want 1 each", len(pb), len(db))
	}
	if want := pdGolden(t, "prefill_request.json"); !reflect.DeepEqual(pb[0], want) {
		t.Errorf("prefill request:\n got %v\nwant %v", pb[0], want)
	}
	if want := pdGolden(t, "decode_request.json"); !reflect.DeepEqual(db[0], want) {
		t.Errorf("decode request:\n got %v\nwant %v", db[0], want)
	}
	waitFor(t, "the request's record", func() bool { return len(tr.srv.records.Since(0, 0)) == 1 })
	rec := tr.srv.records.Since(0, 0)[0]
	if rec.PDPath != "split" || rec.PrefillReplica != tr.reps[0].Name() || rec.Replica != tr.reps[1].Name() || rec.PrefillS <= 0 || rec.DecodeFirstS <= 0 {
		t.Errorf("record %+v: want split, prefill on %s, decode on %s, phases timed", rec, tr.reps[0].Name(), tr.reps[1].Name())
	}
	if n := testutil.ToFloat64(tr.srv.m.pd.requests.WithLabelValues("m", "split")); n != 1 {
		t.Errorf("gpurouter_pd_requests_total{path=split} = %v, want 1", n)
	}
}

// A prompt under the threshold is served colocated, on any replica, with
// the client's body; a replica that is neither decode nor both is never
// sent a prompt another replica prefilled.
func TestSplitOnlyWhenItPays(t *testing.T) {
	kv, _ := json.Marshal(pdGolden(t, "prefill_response_kv_transfer_params.json"))
	p, d, c := newPDEngine(t, kv), newPDEngine(t, kv), newPDEngine(t, kv)
	tr := startRouterWith(t, []string{p.srv.URL, d.srv.URL, c.srv.URL}, withSplit(1, 1, 1000))
	short := pdClientBody(t)
	long := bytes.Replace(short, []byte("Hamlet"), bytes.Repeat([]byte("Hamlet "), 1000), 1)
	for i := 0; i < 6; i++ {
		for _, body := range [][]byte{short, long} {
			if status, out := postPD(t, tr.url, body); status != 200 {
				t.Fatalf("request %d: %d %s", i, status, out)
			}
		}
	}
	if pre, dec := c.remoteAsked(); pre+dec != 0 || len(c.seen()) == 0 {
		t.Errorf("colocated replica: %d requests, %d asking a remote prefill, %d a remote decode; want some, none, none", len(c.seen()), pre, dec)
	}
	if pre, _ := d.remoteAsked(); pre != 6 {
		t.Errorf("decode replica: %d remote prefills, want the 6 long prompts'", pre)
	}
	if _, dec := p.remoteAsked(); dec != 6 {
		t.Errorf("prefill replica: %d prefills, want the 6 long prompts'", dec)
	}
	for _, e := range []*pdEngine{p, d, c} {
		for _, b := range e.seen() {
			msgs, _ := json.Marshal(b["messages"])
			if !bytes.Contains(msgs, []byte("Hamlet Hamlet")) && b["kv_transfer_params"] != nil {
				t.Errorf("a short prompt was split: %v", b)
			}
		}
	}
}

// A prefill replica that refuses or is gone: the prefill is tried on
// another; with none left the request is served colocated, whole.
func TestSplitPrefillFailures(t *testing.T) {
	kv, _ := json.Marshal(pdGolden(t, "prefill_response_kv_transfer_params.json"))
	refusing, good, d := newPDEngine(t, kv), newPDEngine(t, kv), newPDEngine(t, kv)
	refusing.status = http.StatusServiceUnavailable
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	ln.Close()

	tr := startRouterWith(t, []string{refusing.srv.URL, good.srv.URL, d.srv.URL}, withSplit(2, 1, 1))
	for i := 0; i < 2; i++ { // round robin: one starts on each prefill replica
		if status, out := postPD(t, tr.url, pdClientBody(t)); status != 200 || !strings.Contains(out, "three") {
			t.Fatalf("request %d: %d %q", i, status, out)
		}
	}
	if pre, _ := d.remoteAsked(); pre != 2 {
		t.Errorf("decode replica: %d remote prefills, want 2 (each prefill retried on the good replica)", pre)
	}

	tr2 := startRouterWith(t, []string{gone, d.srv.URL}, withSplit(1, 1, 1))
	status, out := postPD(t, tr2.url, pdClientBody(t))
	if status != 200 || !strings.Contains(out, "three") {
		t.Fatalf("with the prefill replica gone: %d %q", status, out)
	}
	last := d.seen()[len(d.seen())-1]
	if last["kv_transfer_params"] != nil {
		t.Errorf("the fallback carried kv_transfer_params: %v", last["kv_transfer_params"])
	}
	waitFor(t, "the request's record", func() bool { return len(tr2.srv.records.Since(0, 0)) == 1 })
	if rec := tr2.srv.records.Since(0, 0)[0]; rec.PDPath != "fallback" {
		t.Errorf("record's pd_path %q, want fallback", rec.PDPath)
	}
}

// A client that leaves during the prefill ends it there: the prefill
// replica's request is aborted and no decode replica is asked.
func TestSplitClientLeavesDuringPrefill(t *testing.T) {
	kv, _ := json.Marshal(pdGolden(t, "prefill_response_kv_transfer_params.json"))
	p, d := newPDEngine(t, kv), newPDEngine(t, kv)
	p.hold = true
	tr := startRouterWith(t, []string{p.srv.URL, d.srv.URL}, withSplit(1, 1, 1))
	conn, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := pdClientBody(t)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	waitFor(t, "the prefill sent", func() bool { return len(p.seen()) == 1 })
	conn.Close()
	waitFor(t, "the prefill aborted", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.aborted == 1 })
	waitFor(t, "the request's record", func() bool { return len(tr.srv.records.Since(0, 0)) == 1 })
	if rec := tr.srv.records.Since(0, 0)[0]; rec.Outcome != "canceled" {
		t.Errorf("outcome %q, want canceled", rec.Outcome)
	}
	if n := len(d.seen()); n != 0 {
		t.Errorf("decode replica got %d requests, want none", n)
	}
	if n := tr.reps[0].InFlight(); n != 0 {
		t.Errorf("prefill replica has %d in flight, want 0", n)
	}
}

// A decode replica that refuses the decode step, with none other to take
// it: the request is served colocated, its own body on another replica.
func TestSplitDecodeFallback(t *testing.T) {
	kv, _ := json.Marshal(pdGolden(t, "prefill_response_kv_transfer_params.json"))
	p, d, c := newPDEngine(t, kv), newPDEngine(t, kv), newPDEngine(t, kv)
	d.status = http.StatusServiceUnavailable
	tr := startRouterWith(t, []string{p.srv.URL, d.srv.URL, c.srv.URL}, withSplit(1, 1, 1))
	if status, out := postPD(t, tr.url, pdClientBody(t)); status != 200 || !strings.Contains(out, "three") {
		t.Fatalf("client got %d %q", status, out)
	}
	if pre, _ := d.remoteAsked(); pre != 1 || len(d.seen()) != 1 {
		t.Errorf("decode replica: %d requests, %d remote prefills; want the one refused", len(d.seen()), pre)
	}
	var colocated int
	for _, e := range []*pdEngine{p, c} {
		for _, b := range e.seen() {
			if b["kv_transfer_params"] == nil {
				colocated++
			}
		}
	}
	if colocated != 1 {
		t.Errorf("%d colocated requests after the refusal, want 1", colocated)
	}
	waitFor(t, "the request's record", func() bool { return len(tr.srv.records.Since(0, 0)) == 1 })
	if rec := tr.srv.records.Since(0, 0)[0]; rec.PDPath != "fallback" || rec.Replica == tr.reps[1].Name() {
		t.Errorf("record: pd_path %q on %s, want fallback off %s", rec.PDPath, rec.Replica, tr.reps[1].Name())
	}
}

// The prefill step queues at the router, not in the engine: with two
// prefills at a time per replica, concurrent long prompts reach the
// prefill replica two by two, a queued one let out as soon as a slot
// frees — each one let out is placed at once, so the queue never waits
// for one prefill to end before letting the next fill the other slot.
func TestSplitPrefillQueuesAtTheRouter(t *testing.T) {
	kv, _ := json.Marshal(pdGolden(t, "prefill_response_kv_transfer_params.json"))
	p, d := newPDEngine(t, kv), newPDEngine(t, kv)
	p.delay = 100 * time.Millisecond
	tr := startRouterWith(t, []string{p.srv.URL, d.srv.URL}, func(o *Options) {
		withSplit(1, 1, 1)(o)
		sp := o.Routes[0].Split
		sp.PrefillsPerReplica = 2
		ctl, err := admission.New("m/prefill", sp.AdmissionConfig(admission.Config{}), admission.Deps{Capacity: sp})
		if err != nil {
			t.Fatal(err)
		}
		sp.Admission = ctl
	})
	const n = 8
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], _ = postPD(t, tr.url, pdClientBody(t))
		}()
	}
	wg.Wait()
	for i, st := range statuses {
		if st != 200 {
			t.Errorf("request %d: %d", i, st)
		}
	}
	if m := p.maxPrefilling.Load(); m != 2 {
		t.Errorf("the prefill replica had %d prefills at once, want 2", m)
	}
	// Most prefills start beside another (4 to 7 of 8 here); a queue that
	// lets them out one by one starts one so (1 of 8).
	if o := p.overlapped.Load(); o < 3 {
		t.Errorf("%d of %d prefills started beside another: the queue let them out one by one", o, n)
	}
	if pre, _ := d.remoteAsked(); pre != n {
		t.Errorf("decode replica: %d remote prefills, want %d", pre, n)
	}
}

// A long prompt a decode replica already holds in its prefix cache is
// served colocated: what is left to prefill there is under the split's
// threshold, and a split would ship every block of the prompt again.
// Another long prompt is still split.
func TestSplitNotWhenADecodeReplicaHoldsThePrompt(t *testing.T) {
	kv, _ := json.Marshal(pdGolden(t, "prefill_response_kv_transfer_params.json"))
	p, d := newPDEngine(t, kv), newPDEngine(t, kv)
	tr := startRouterWith(t, []string{p.srv.URL, d.srv.URL}, withSplit(1, 1, 1000))
	tr.pool.SetPrefixCache(&balancer.PrefixCache{Index: prefixcache.NewIndex(), BlockSize: prefixcache.DefaultBlockBytes, Approximate: true})
	for i, r := range tr.reps {
		if _, err := tr.pool.PrefixCache().Index.Add(r.Name(), 1<<16); err != nil {
			t.Fatal(err)
		}
		r.SetPrefixSlot(i)
	}
	short := pdClientBody(t)
	long := bytes.Replace(short, []byte("Hamlet"), bytes.Repeat([]byte("Hamlet "), 1000), 1)
	other := bytes.Replace(short, []byte("Hamlet"), bytes.Repeat([]byte("Ophelia "), 1000), 1)
	for i, tc := range []struct {
		body        []byte
		wantRemotes int // remote prefills the decode replica was asked for, in all
	}{{long, 1}, {long, 1}, {long, 1}, {other, 2}} {
		if status, out := postPD(t, tr.url, tc.body); status != 200 {
			t.Fatalf("request %d: %d %s", i, status, out)
		}
		if pre, _ := d.remoteAsked(); pre != tc.wantRemotes {
			t.Fatalf("after request %d: %d remote prefills; want %d", i, pre, tc.wantRemotes)
		}
	}
}

// The prefill step picks among the prefill replicas under their
// PrefillsPerReplica when some are: its admission counted a place on one
// of them, and a policy scoring by its own signals may prefer a full one.
func TestSplitPicksAPrefillReplicaWithRoom(t *testing.T) {
	var reps []*balancer.Replica
	for _, name := range []string{"p0", "p1", "p2"} {
		r, err := balancer.NewReplica(balancer.ReplicaConfig{Name: name, URL: "http://127.0.0.1:1"}, balancer.BreakerConfig{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, r)
	}
	sp := NewSplit(reps, nil, &balancer.RoundRobin{})
	sp.PrefillsPerReplica = 2
	if got := sp.AdmissionConfig(admission.Config{}).MaxInFlight; got != 6 {
		t.Errorf("the prefill step's cap: %d in flight, want 6 (2 on each of 3)", got)
	}
	sp.inFlight[0].Store(2)
	sp.inFlight[2].Store(1)
	if got := sp.untried(nil); len(got) != 2 || slices.Contains(got, reps[0]) {
		t.Errorf("candidates %v: want p1 and p2, not the full p0", replicaNames(got))
	}
	if got := sp.untried([]*balancer.Replica{reps[1], reps[2]}); len(got) != 1 || got[0] != reps[0] {
		t.Errorf("candidates once p1 and p2 were tried: %v, want the full p0 (a retry may still go there)", replicaNames(got))
	}
}

func replicaNames(rs []*balancer.Replica) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name()
	}
	return out
}

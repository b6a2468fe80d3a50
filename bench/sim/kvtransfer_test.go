package sim

import (
	"bytes"
	"encoding/json"
	"maps"
	"net"
	"strings"
	"testing"
)

// pdReplica starts one replica with a NixlConnector, as one `gpurouter
// sim --kv-transfer-role …` process, and returns it and its URL.
func pdReplica(t *testing.T, kc KVTransferConfig, f Faults) (*Replica, string) {
	t.Helper()
	fl := startFleet(t, FleetConfig{Replicas: 1, Profiles: []Profile{mustBuiltin(t, "qwen2.5-7b")}, Speeds: []float64{10},
		ServedModelNames: []string{"m"}, Seed: 1, KVTransfer: &kc, Faults: f})
	return fl.Replicas()[0], fl.URLs()[0]
}

// The test's stand-in for the router's half (issue 54's router side comes
// later), with the shapes of vLLM's toy_proxy_server.py
// (tests/v1/kv_connector/nixl_integration/, send_request_to_service):
// the prefill request is the client's with kv_transfer_params asking for a
// remote decode, stream false, max_tokens 1 (max_completion_tokens 1 if
// given), without stream_options, min_tokens and min_completion_tokens;
// the decode request is the client's own with the prefill response's
// kv_transfer_params.
func prefillRequest(orig map[string]any) map[string]any {
	req := maps.Clone(orig)
	req["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	req["stream"] = false
	req["max_tokens"] = 1
	if _, ok := req["max_completion_tokens"]; ok {
		req["max_completion_tokens"] = 1
	}
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
		delete(req, k)
	}
	return req
}

func decodeRequest(orig map[string]any, params json.RawMessage) map[string]any {
	req := maps.Clone(orig)
	req["kv_transfer_params"] = params
	return req
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// prefill sends the prefill request and returns the response's
// kv_transfer_params (raw, in the server's key order).
func prefill(t *testing.T, url string, orig map[string]any, reqID string) json.RawMessage {
	t.Helper()
	code, _, body := httpDo(t, "POST", url+"/v1/chat/completions", mustJSON(t, prefillRequest(orig)), "X-Request-Id", reqID)
	if code != 200 {
		t.Fatalf("prefill: %d %s", code, body)
	}
	var resp struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].FinishReason != "length" || resp.Usage.CompletionTokens != 1 {
		t.Fatalf("prefill response %s: want one token, length", body)
	}
	return resp.KVTransferParams
}

func chatRequest(content string, maxTokens int) map[string]any {
	return map[string]any{"model": "m", "stream": true, "stream_options": map[string]any{"include_usage": true},
		"max_tokens": maxTokens, "min_tokens": 10, "ignore_eos": true, "seed": 5, "temperature": 0.7,
		"messages": []map[string]any{{"role": "system", "content": "You are a helpful assistant."},
			{"role": "user", "content": content}}}
}

func pdCounter(t *testing.T, r *Replica, name, label, value string) float64 {
	t.Helper()
	return counterOf(t, r.Registry(), name, label, value)
}

// One request, two replicas: the prefill replica holds the prompt's blocks
// until the decode replica reads them over its side channel, then frees
// them; the decode replica streams exactly what one replica alone would.
func TestPDSplitEndToEnd(t *testing.T) {
	p, pURL := pdReplica(t, KVTransferConfig{Role: KVProducer}, Faults{})
	d, dURL := pdReplica(t, KVTransferConfig{Role: KVConsumer}, Faults{})
	solo := startFleet(t, FleetConfig{Replicas: 1, Profiles: []Profile{mustBuiltin(t, "qwen2.5-7b")}, Speeds: []float64{10},
		ServedModelNames: []string{"m"}, Seed: 1})

	orig := chatRequest(testEstimator(t).Synthesize(300, 3), 40)
	raw := prefill(t, pURL, orig, "e2e-1")
	var params kvTransferParamsIn
	if err := json.Unmarshal(raw, &params); err != nil || !params.DoRemotePrefill || !params.remote() {
		t.Fatalf("kv_transfer_params %s: %v", raw, err)
	}
	held := len(params.RemoteBlockIDs)
	if st := p.State(); st.UsedBlocks != held || st.Running+st.Waiting != 0 {
		t.Errorf("prefill replica after its answer: %+v, want %d blocks held, no request", st, held)
	}
	if *params.RemotePort != portOf(t, p.KVSideChannelAddr()) || *params.RemoteHost != "127.0.0.1" {
		t.Errorf("remote %s:%d, side channel at %s", *params.RemoteHost, *params.RemotePort, p.KVSideChannelAddr())
	}

	text, _, _ := streamText(t, dURL, "/v1/chat/completions", mustJSON(t, decodeRequest(orig, raw)))
	want, _, _ := streamText(t, solo.URLs()[0], "/v1/chat/completions", mustJSON(t, orig))
	if text != want || len(strings.Fields(text)) != 40 {
		t.Errorf("decode replica's text %q\nwant one replica's %q", text, want)
	}
	if st := p.State(); st.UsedBlocks != 0 {
		t.Errorf("prefill replica still holds %d blocks after the read", st.UsedBlocks)
	}
	if n := pdCounter(t, d, "gpurouter_sim_kv_transfer_pulls_total", "outcome", pullOK); n != 1 {
		t.Errorf("decode replica: %v ok reads", n)
	}
	dm := scrape(t, dURL)
	pm := scrape(t, pURL)
	wantBytes := float64(held*16) * 57344
	if dm["vllm:nixl_xfer_time_seconds_count"] != 1 || dm["gpurouter_sim_kv_transfer_received_bytes_total"] != wantBytes ||
		pm["gpurouter_sim_kv_transfer_sent_bytes_total"] != wantBytes || pm["gpurouter_sim_kv_transfer_sent_total"] != 1 {
		t.Errorf("transfer metrics: decode %v/%v bytes %v, prefill sent %v bytes %v", dm["vllm:nixl_xfer_time_seconds_count"],
			dm["gpurouter_sim_kv_transfer_received_bytes_total"], wantBytes, pm["gpurouter_sim_kv_transfer_sent_total"],
			pm["gpurouter_sim_kv_transfer_sent_bytes_total"])
	}
	// The decode replica computed one prompt token, the prefill replica
	// the prompt: the iteration histogram's sums say so.
	if dm["vllm:nixl_num_failed_transfers_total"] != 0 || dm["gpurouter_sim_kv_transfer_recomputed_total"] != 0 {
		t.Errorf("failures counted on a clean read: %v", dm)
	}
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	var port int
	if i := strings.LastIndexByte(addr, ':'); i >= 0 {
		for _, c := range addr[i+1:] {
			port = port*10 + int(c-'0')
		}
	}
	return port
}

// A replica without a connector ignores kv_transfer_params, as vLLM's
// scheduler does: a prefill-shaped request is answered as any other
// (blocks freed, no kv_transfer_params in the response), and its
// /metrics has none of the connector's series.
func TestPDNoConnectorIgnores(t *testing.T) {
	f := startFleet(t, FleetConfig{Replicas: 1, Profiles: []Profile{mustBuiltin(t, "qwen2.5-7b")}, Speeds: []float64{10},
		ServedModelNames: []string{"m"}})
	url := f.URLs()[0]
	orig := chatRequest("hello there", 5)
	code, _, body := httpDo(t, "POST", url+"/v1/chat/completions", mustJSON(t, prefillRequest(orig)))
	if code != 200 || bytes.Contains(body, []byte("kv_transfer_params")) {
		t.Fatalf("%d %s", code, body)
	}
	if st := f.Replicas()[0].State(); st.UsedBlocks != 0 {
		t.Errorf("%d blocks held without a connector", st.UsedBlocks)
	}
	bogus := json.RawMessage(`{"do_remote_prefill":true,"remote_engine_id":"x","remote_request_id":"y",` +
		`"remote_block_ids":[1,2],"remote_host":"127.0.0.1","remote_port":1}`)
	if text, _, _ := streamText(t, url, "/v1/chat/completions", mustJSON(t, decodeRequest(orig, bogus))); len(strings.Fields(text)) != 5 {
		t.Errorf("decode-shaped request: %q", text)
	}
	_, _, m := httpDo(t, "GET", url+"/metrics", "")
	for _, s := range []string{"nixl", "gpurouter_sim_kv_transfer", `finished_reason="error"`} {
		if bytes.Contains(m, []byte(s)) {
			t.Errorf("/metrics without a connector has %s", s)
		}
	}
}

// A fleet whose side channels cannot all be bound binds nothing: the
// ports of the replicas before the one that failed are free again.
func TestPDFleetListenFailureUnbinds(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	if free, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", itoa(port-1))); err != nil {
		t.Skipf("port %d, below an ephemeral one, is in use here", port-1)
	} else {
		free.Close()
	}
	f, err := NewFleet(FleetConfig{Replicas: 2, Profiles: []Profile{mustBuiltin(t, "qwen2.5-7b")}, Estimator: testEstimator(t),
		KVTransfer: &KVTransferConfig{Role: KVProducer, SideChannelPort: port - 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Listen(); err == nil || !strings.Contains(err.Error(), "side channel") {
		t.Fatalf("Listen with replica 1's side channel port taken: %v", err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", itoa(port-1)))
	if err != nil {
		t.Errorf("replica 0's side channel port still bound: %v", err)
	} else {
		ln.Close()
	}
}

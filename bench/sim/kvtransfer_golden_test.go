package sim

import (
	"bytes"
	"encoding/json"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden/pd/*.json from the simulator")

// goldenEngineID is the prefill replica's engine_id in the golden files
// (vLLM draws a uuid4; fixed here so that the files are stable).
const goldenEngineID = "3f2c8a9e-5d1b-4c7e-9a6f-1b2c3d4e5f60"

// Acceptance 3 of issue 54: the prefill request, the prefill response's
// kv_transfer_params and the decode request, as golden files, each checked
// against vLLM's shapes (testdata/golden/pd/README.md says where each
// field comes from). The side channel's port is ephemeral here: the files
// carry vLLM's default, 5600.
func TestPDGolden(t *testing.T) {
	p, pURL := pdReplica(t, KVTransferConfig{Role: KVProducer, EngineID: goldenEngineID}, Faults{})
	orig := map[string]any{"model": "m", "stream": true, "stream_options": map[string]any{"include_usage": true},
		"max_tokens": 200, "min_tokens": 10, "temperature": 0.7,
		"messages": []map[string]any{{"role": "system", "content": "You are a helpful assistant."},
			{"role": "user", "content": "Summarize the plot of Hamlet in three sentences, naming every character who dies."}}}
	raw := prefill(t, pURL, orig, "golden-1")
	port := []byte(`"remote_port":` + itoa(portOf(t, p.KVSideChannelAddr())))
	if !bytes.Contains(raw, port) {
		t.Fatalf("no %s in %s", port, raw)
	}
	raw = bytes.Replace(raw, port, []byte(`"remote_port":5600`), 1)

	files := map[string]any{
		"prefill_request.json":                     prefillRequest(orig),
		"prefill_response_kv_transfer_params.json": raw,
		"decode_request.json":                      decodeRequest(orig, raw),
	}
	for name, v := range files {
		got, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, '\n')
		path := filepath.Join("testdata", "golden", "pd", name)
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (go test -run TestPDGolden -update writes it)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s changed:\n%s\nwant:\n%s", name, got, want)
		}
	}
	checkVLLMShapes(t, files)
}

func itoa(n int) string { return string(mustJSONBytes(n)) }

func mustJSONBytes(v any) []byte { b, _ := json.Marshal(v); return b }

// checkVLLMShapes holds the three documents to vLLM's: key sets, types,
// order and values as vLLM's code makes and reads them.
func checkVLLMShapes(t *testing.T, files map[string]any) {
	t.Helper()
	// toy_proxy_server.py, send_request_to_service.
	pre := files["prefill_request.json"].(map[string]any)
	params := pre["kv_transfer_params"].(map[string]any)
	wantParams := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	if !maps.Equal(params, wantParams) || pre["stream"] != false || pre["max_tokens"] != 1 {
		t.Errorf("prefill request: %v", pre)
	}
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
		if _, ok := pre[k]; ok {
			t.Errorf("prefill request carries %s", k)
		}
	}
	// nixl_connector.py, NixlConnectorScheduler.request_finished: the dict
	// and its key order.
	raw := files["prefill_response_kv_transfer_params.json"].(json.RawMessage)
	dec := json.NewDecoder(bytes.NewReader(raw))
	var keys []string
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	for dec.More() {
		k, _ := dec.Token()
		keys = append(keys, k.(string))
		var skip json.RawMessage
		_ = dec.Decode(&skip)
	}
	if got := strings.Join(keys, ","); got != "do_remote_prefill,do_remote_decode,remote_block_ids,remote_engine_id,"+
		"remote_request_id,remote_host,remote_port,tp_size" {
		t.Errorf("response kv_transfer_params keys %s", got)
	}
	var out struct {
		DoRemotePrefill bool   `json:"do_remote_prefill"`
		DoRemoteDecode  bool   `json:"do_remote_decode"`
		RemoteBlockIDs  []int  `json:"remote_block_ids"`
		RemoteEngineID  string `json:"remote_engine_id"`
		RemoteRequestID string `json:"remote_request_id"`
		RemoteHost      string `json:"remote_host"`
		RemotePort      int    `json:"remote_port"`
		TPSize          int    `json:"tp_size"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	if !out.DoRemotePrefill || out.DoRemoteDecode || len(out.RemoteBlockIDs) == 0 || out.RemoteEngineID != goldenEngineID ||
		!strings.HasPrefix(out.RemoteRequestID, "chatcmpl-golden-1-") || out.RemoteHost != "127.0.0.1" || out.TPSize != 1 {
		t.Errorf("response kv_transfer_params %+v", out)
	}
	// The decode request is the client's, plus those params (the toy
	// proxy's req_data["kv_transfer_params"] = kv_transfer_params).
	d := files["decode_request.json"].(map[string]any)
	if !bytes.Equal(d["kv_transfer_params"].(json.RawMessage), raw) || d["stream"] != true || d["max_tokens"] != 200 ||
		d["min_tokens"] != 10 || d["stream_options"] == nil {
		t.Errorf("decode request: %v", d)
	}
}

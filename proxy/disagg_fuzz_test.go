package proxy

import (
	"encoding/json"
	"testing"
)

// The split's bodies from any client body: an object the router can edit
// becomes a prefill request of vLLM's shape and a decode request carrying
// the prefill's kv_transfer_params, each one valid JSON; anything else is
// refused (served colocated). kvParamsOf reads any engine answer without
// failing.
func FuzzSplitBodies(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":"x","max_completion_tokens":3,"min_tokens":2,"kv_transfer_params":{"do_remote_prefill":true}}`,
		`[]`, `{"a":`, `null`, `{"kv_transfer_params":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		kvParamsOf(body)
		pb, err := prefillBody(body)
		if err != nil {
			return
		}
		var p map[string]any
		if err := json.Unmarshal(pb, &p); err != nil {
			t.Fatalf("prefill body %q is not JSON: %v", pb, err)
		}
		kv, _ := p["kv_transfer_params"].(map[string]any)
		if p["max_tokens"] != 1.0 || p["stream"] != false || kv["do_remote_decode"] != true || p["stream_options"] != nil {
			t.Fatalf("prefill body %s is not vLLM's prefill request", pb)
		}
		if _, ok := p["max_completion_tokens"]; ok && p["max_completion_tokens"] != 1.0 {
			t.Fatalf("prefill body %s keeps max_completion_tokens", pb)
		}
		db, err := decodeBody(body, json.RawMessage(`{"do_remote_prefill":true}`))
		if err != nil {
			t.Fatalf("decode body of %q: %v", body, err)
		}
		var d map[string]any
		if err := json.Unmarshal(db, &d); err != nil {
			t.Fatalf("decode body %q is not JSON: %v", db, err)
		}
		if kv, _ := d["kv_transfer_params"].(map[string]any); kv["do_remote_prefill"] != true {
			t.Fatalf("decode body %s lacks the prefill's kv_transfer_params", db)
		}
	})
}

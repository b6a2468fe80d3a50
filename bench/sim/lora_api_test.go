package sim

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func loraFleet(t *testing.T, runtime bool) *Fleet {
	p := loraProfile(t, 2, 4)
	return startFleet(t, FleetConfig{Replicas: 1, Profiles: []Profile{p}, Speeds: []float64{10},
		ServedModelNames: []string{"qwen", "qwen-alias"}, AllowRuntimeLoRAUpdating: runtime,
		LoRAModules: []LoRAModule{{Name: "sql", Path: "/adapters/sql"}, {Name: "chat", Path: "/adapters/chat", BaseModelName: "qwen-alias"}}})
}

type modelList struct {
	Data []struct {
		ID          string  `json:"id"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen *int    `json:"max_model_len"`
	} `json:"data"`
}

func listModels(t *testing.T, u string) (ids []string, ml modelList) {
	t.Helper()
	code, _, body := httpDo(t, "GET", u+"/v1/models", "")
	if err := json.Unmarshal(body, &ml); err != nil || code != 200 {
		t.Fatalf("/v1/models = %d %s", code, body)
	}
	for _, d := range ml.Data {
		ids = append(ids, d.ID)
	}
	return ids, ml
}

func TestLoRAServing(t *testing.T) {
	f := loraFleet(t, false)
	u := f.URLs()[0]

	ids, ml := listModels(t, u)
	if !reflect.DeepEqual(ids, []string{"qwen", "qwen-alias", "sql", "chat"}) {
		t.Fatalf("/v1/models ids %v", ids)
	}
	if d := ml.Data[0]; d.Parent != nil || d.MaxModelLen == nil || *d.MaxModelLen != 32768 {
		t.Errorf("base card %+v", d)
	}
	if d := ml.Data[2]; d.Parent == nil || *d.Parent != "qwen" || d.Root != "/adapters/sql" || d.MaxModelLen != nil {
		t.Errorf("adapter card %+v: want parent qwen, root its path, max_model_len null", d)
	}
	if d := ml.Data[3]; d.Parent == nil || *d.Parent != "qwen-alias" {
		t.Errorf("adapter with base_model_name: %+v", d)
	}

	code, _, body := httpDo(t, "POST", u+"/v1/completions", `{"model":"sql","prompt":"select","max_tokens":3,"ignore_eos":true}`)
	var resp struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(body, &resp); err != nil || code != 200 || resp.Model != "sql" {
		t.Errorf("completion for an adapter = %d %s: want 200 and model sql", code, body)
	}
	code, _, body = httpDo(t, "POST", u+"/v1/completions", `{"model":"nope","prompt":"x","max_tokens":3}`)
	if code != 404 || !strings.Contains(string(body), "The model `nope` does not exist.") {
		t.Errorf("unknown adapter = %d %s", code, body)
	}

	mfs := metricFamilies(t, u)
	info := mfs["vllm:lora_requests_info"]
	if info == nil || len(info.GetMetric()) == 0 {
		t.Fatal("no vllm:lora_requests_info")
	}
	for _, m := range info.GetMetric() {
		l := labelMap(m)
		if len(l) != 3 || l["max_lora"] != "2" {
			t.Errorf("vllm:lora_requests_info labels %v: want max_lora, running and waiting only", l)
		}
	}
	if mfs["gpurouter_sim_lora_swaps_total"] == nil {
		t.Error("no gpurouter_sim_lora_swaps_total")
	}

	// Without VLLM_ALLOW_RUNTIME_LORA_UPDATING the routes do not exist.
	code, _, body = httpDo(t, "POST", u+"/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/x"}`)
	if code != 404 || string(body) != `{"detail":"Not Found"}` {
		t.Errorf("load without runtime updating = %d %s", code, body)
	}
}

func TestLoRARuntimeLoading(t *testing.T) {
	f := loraFleet(t, true)
	u := f.URLs()[0]
	r := f.Replicas()[0]
	post := func(path, body string) (int, string) {
		code, _, b := httpDo(t, "POST", u+path, body)
		return code, string(b)
	}
	apiError := func(body string) (typ, msg string) {
		var e apiErrorBody
		_ = json.Unmarshal([]byte(body), &e)
		return e.Error.Type, e.Error.Message
	}

	if code, body := post("/v1/load_lora_adapter", `{"lora_name":"new","lora_path":"/adapters/new"}`); code != 200 ||
		body != "Success: LoRA adapter 'new' added successfully." {
		t.Fatalf("load = %d %q", code, body)
	}
	if ids, _ := listModels(t, u); !reflect.DeepEqual(ids, []string{"qwen", "qwen-alias", "sql", "chat", "new"}) {
		t.Errorf("after load: %v", ids)
	}
	if st := r.State(); st.LoRASwapsDisk != 1 || st.LoRAInGPU[len(st.LoRAInGPU)-1] != "new" {
		t.Errorf("after load: %+v, want one load from disk and new in a slot", st)
	}
	if code, _, _ := httpDo(t, "POST", u+"/v1/chat/completions", `{"model":"new","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`); code != 200 {
		t.Errorf("chat for the loaded adapter = %d", code)
	}

	for _, c := range []struct {
		name, path, body string
		code             int
		typ, msg         string
	}{
		{"load twice", "/v1/load_lora_adapter", `{"lora_name":"new","lora_path":"/x"}`, 400, "InvalidUserInput", "The lora adapter 'new' has already been loaded."},
		{"load without path", "/v1/load_lora_adapter", `{"lora_name":"y"}`, 400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."},
		{"unload", "/v1/unload_lora_adapter", `{"lora_name":"new"}`, 200, "", ""},
		{"unload twice", "/v1/unload_lora_adapter", `{"lora_name":"new"}`, 404, "NotFoundError", "The lora adapter 'new' cannot be found."},
		{"unload nothing", "/v1/unload_lora_adapter", `{}`, 400, "InvalidUserInput", "either 'lora_name' and 'lora_int_id' needs to be provided."},
	} {
		code, body := post(c.path, c.body)
		typ, msg := apiError(body)
		if code != c.code || (c.code != 200 && (typ != c.typ || msg != c.msg)) {
			t.Errorf("%s = %d %s, want %d %s %q", c.name, code, body, c.code, c.typ, c.msg)
		}
	}
	if code, _, _ := httpDo(t, "POST", u+"/v1/completions", `{"model":"new","prompt":"x","max_tokens":2}`); code != 404 {
		t.Errorf("request for an unloaded adapter = %d, want 404", code)
	}

	// Faults: a refused load, then a slow one.
	if err := r.SetFaults(Faults{LoRALoadRefuse: true}); err != nil {
		t.Fatal(err)
	}
	code, body := post("/v1/load_lora_adapter", `{"lora_name":"bad","lora_path":"/adapters/bad"}`)
	if typ, msg := apiError(body); code != 400 || typ != "BadRequestError" || msg != "Loading lora /adapters/bad failed" {
		t.Errorf("refused load = %d %s", code, body)
	}
	if _, err := r.LoadLoRAAdapter("bad", "/adapters/bad"); !errors.Is(err, ErrLoRARefused) {
		t.Errorf("LoadLoRAAdapter under the fault: %v", err)
	}
	if err := r.SetFaults(Faults{LoRALoadDelaySeconds: 0.3}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if code, body := post("/v1/load_lora_adapter", `{"lora_name":"slow","lora_path":"/adapters/slow"}`); code != 200 {
		t.Errorf("slow load = %d %s", code, body)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("slow load answered after %v, before its 300ms delay", took)
	}
	if got := r.Adapters(); !reflect.DeepEqual(got, []string{"sql", "chat", "slow"}) {
		t.Errorf("adapters %v", got)
	}
}

func TestLoRAConfigErrors(t *testing.T) {
	p := mustBuiltin(t, "qwen2.5-7b")
	_, err := NewReplica(ReplicaConfig{Profile: p, Estimator: testEstimator(t), LoRAModules: []LoRAModule{{Name: "a", Path: "/a"}}})
	if !errors.Is(err, ErrLoRADisabled) {
		t.Errorf("--lora-modules without --enable-lora: %v", err)
	}
	r, err := NewReplica(ReplicaConfig{Profile: p, Estimator: testEstimator(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.LoadLoRAAdapter("a", "/a"); !errors.Is(err, ErrLoRADisabled) {
		t.Errorf("load without LoRA: %v", err)
	}
	p = loraProfile(t, 1, 1)
	for _, mods := range [][]LoRAModule{
		{{Name: "a", Path: "/a"}, {Name: "a", Path: "/b"}},
		{{Name: "Qwen/Qwen2.5-7B-Instruct", Path: "/a"}},
	} {
		if _, err := NewReplica(ReplicaConfig{Profile: p, Estimator: testEstimator(t), LoRAModules: mods}); !errors.Is(err, ErrLoRAExists) {
			t.Errorf("modules %v: %v", mods, err)
		}
	}
}

func TestParseLoRAModules(t *testing.T) {
	got, err := ParseLoRAModules([]string{"sql=/adapters/sql", `{"name":"chat","path":"/a/chat","base_model_name":"m"}`})
	want := []LoRAModule{{Name: "sql", Path: "/adapters/sql"}, {Name: "chat", Path: "/a/chat", BaseModelName: "m"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("ParseLoRAModules = %+v, %v", got, err)
	}
	for _, bad := range []string{"sql", "=/path", "sql=", `{"name":"x"}`, `{"name":"x","path":"/p","rank":8}`, `{`} {
		if _, err := ParseLoRAModules([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

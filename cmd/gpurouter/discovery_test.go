package main

import (
	"bytes"
	"context"
	"reflect"
	"slices"
	"testing"

	"github.com/gpurouter/gpurouter/discovery"
	"go.uber.org/zap"
)

func TestDiscoveryConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		want []string
	}{
		{"both kinds", "pools: [{model: m, discovery: {dns: {name: a, port: 1}, kubernetes: {selector: app=x, port: 1}}}]",
			[]string{"pools[0].discovery: set exactly one of dns and kubernetes"}},
		{"neither", "pools: [{model: m, discovery: {}}]",
			[]string{"pools[0].discovery: set exactly one of dns and kubernetes"}},
		{"replicas too", "pools: [{model: m, replicas: [{url: 'http://a:1'}], discovery: {dns: {name: a, port: 1}}}]",
			[]string{"pools[0].replicas: must be empty with discovery"}},
		{"dns without name and port", "pools: [{model: m, discovery: {dns: {interval: -1s, scheme: ftp}}}]",
			[]string{"pools[0].discovery.dns.name: required", "pools[0].discovery.dns.port: must be 1-65535, got 0",
				"pools[0].discovery.dns.interval: must be > 0", "pools[0].discovery.dns.scheme: must be one of http, https"}},
		{"kubernetes: two kinds", "pools: [{model: m, discovery: {kubernetes: {selector: app=x, port: 1, service: s}}}]",
			[]string{"pools[0].discovery.kubernetes: exactly one of selector, service and inference_pool is required"}},
		{"kubernetes: selector without port", "pools: [{model: m, discovery: {kubernetes: {selector: 'app in (x'}}}]",
			[]string{"pools[0].discovery.kubernetes: selector:", "pools[0].discovery.kubernetes: port: 1-65535 required with selector"}},
		{"kubernetes: port_name without service", "pools: [{model: m, discovery: {kubernetes: {inference_pool: p, port_name: http}}}]",
			[]string{"pools[0].discovery.kubernetes: port_name: only with service"}},
		{"kubernetes: gpu annotations on slices", "pools: [{model: m, discovery: {kubernetes: {service: s, gpu_annotations: true}}}]",
			[]string{"pools[0].discovery.kubernetes: gpu_annotations: EndpointSlices carry no pod annotations"}},
		{"no replicas, no discovery", "pools: [{model: m}]",
			[]string{"pools[0].replicas: at least one replica is required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig([]byte(tc.yaml))
			assertErrContains(t, err, tc.want)
		})
	}

	cfg, err := parseConfig([]byte("pools: [{model: m, discovery: {kubernetes: {inference_pool: p}}}]"))
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.Pools[0].Discovery.Kubernetes
	if k.Namespace != "default" || k.Scheme != "http" || k.Kubeconfig != "" {
		t.Fatalf("kubernetes defaults: %+v", *k)
	}
}

func TestDiscoveryFromFlags(t *testing.T) {
	cfg, err := configFromFlags(":8080", []string{"m=dns://vllm.llm.svc:8000", "n=http://127.0.0.1:9"}, "round_robin")
	if err != nil {
		t.Fatal(err)
	}
	want := dnsDiscoveryConfig{Name: "vllm.llm.svc", Port: 8000, Interval: discovery.DefaultDNSInterval, Scheme: "http"}
	if d := cfg.Pools[0].Discovery; d == nil || d.DNS == nil || *d.DNS != want || cfg.Pools[0].Policy != "round_robin" || cfg.Pools[0].Replicas != nil {
		t.Fatalf("pool from dns flag: %+v", cfg.Pools[0])
	}
	if cfg.Pools[1].Discovery != nil {
		t.Fatalf("a URL pool got discovery: %+v", cfg.Pools[1].Discovery)
	}
	var buf bytes.Buffer
	if err := writeConfigYAML(&buf, cfg); err != nil {
		t.Fatal(err)
	}
	back, err := parseConfig(buf.Bytes())
	if err != nil || !reflect.DeepEqual(back, cfg) {
		t.Fatalf("--print-config does not load back the same: %v\n%s", err, buf.String())
	}
	for _, bad := range []string{"m=dns://vllm", "m=dns://vllm:8000,http://a:1", "m=dns://:80"} {
		if _, err := configFromFlags(":8080", []string{bad}, ""); err == nil {
			t.Errorf("--pool %s accepted", bad)
		}
	}
}

// The router built from a discovered pool: the fleet is the sources' sink,
// a reload keeps what discovery found and reports a discovery change as
// restart-only, and a kubeconfig that cannot be read fails at start.
func TestDiscoveryWiring(t *testing.T) {
	cfg, err := configFromFlags("127.0.0.1:0", []string{"m=dns://vllm.invalid:8000"}, "")
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRouter(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.sources) != 1 {
		t.Fatalf("%d discovery sources, want 1", len(r.sources))
	}
	if _, ok := r.sources[0].(*discovery.DNS); !ok {
		t.Fatalf("source %T, want *discovery.DNS", r.sources[0])
	}
	eps := []discovery.Endpoint{{Name: "a", URL: "http://127.0.0.2:8000"}, {Name: "b", URL: "http://127.0.0.3:8000", Draining: true}}
	if err := r.fleet.SetEndpoints(context.Background(), "m", eps); err != nil {
		t.Fatal(err)
	}
	if err := r.reload(cfg); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rep := range r.fleet.Replicas() {
		names = append(names, rep.Name())
	}
	if !slices.Equal(names, []string{"a", "b"}) || !r.fleet.Replica("m", "b").Draining() {
		t.Fatalf("after reload: %v (b draining %v); want a and draining b kept", names, r.fleet.Replica("m", "b").Draining())
	}
	changed := cfg
	changed.Pools = slices.Clone(cfg.Pools)
	changed.Pools[0].Discovery = &discoveryConfig{DNS: &dnsDiscoveryConfig{Name: "other", Port: 8000, Interval: discovery.DefaultDNSInterval, Scheme: "http"}}
	if got := restartOnly(cfg, changed); !slices.Contains(got, "pools[].discovery") {
		t.Fatalf("restartOnly = %v, want pools[].discovery", got)
	}

	kcfg, err := parseConfig([]byte("pools: [{model: m, discovery: {kubernetes: {kubeconfig: /nonexistent/kubeconfig, selector: app=vllm, port: 8000}}}]"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newRouter(kcfg, zap.NewNop()); err == nil {
		t.Fatal("a kubeconfig that does not exist was accepted")
	} else {
		assertErrContains(t, err, []string{"pools[0].discovery.kubernetes", "/nonexistent/kubeconfig"})
	}
}

// A pod's GPU annotations are held to a gpu binding's rules before a
// source is built from them.
func TestDiscoveredGPU(t *testing.T) {
	r := &router{gpus: newGPUSources(zap.NewNop())}
	for _, tc := range []struct {
		g  discovery.GPU
		ok bool
	}{
		{discovery.GPU{AgentURL: "http://10.0.0.1:9401", UUID: "GPU-1"}, true},
		{discovery.GPU{DCGMURL: "http://10.0.0.1:9400/metrics", Label: "0,1"}, true},
		{discovery.GPU{AgentURL: "http://10.0.0.1:9401"}, false}, // an agent needs the UUID
		{discovery.GPU{DCGMURL: "ftp://x"}, false},
		{discovery.GPU{AgentURL: "http://a:1", DCGMURL: "http://b:2", UUID: "GPU-1"}, false},
	} {
		src, err := r.discoveredGPU(tc.g)
		if (err == nil) != tc.ok || (tc.ok && src == nil) {
			t.Errorf("%+v: source %v, error %v", tc.g, src, err)
		}
	}
}

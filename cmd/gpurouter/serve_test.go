package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestServeFlags(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		code     int
		inStdout string
		inStderr string
	}{
		{"no config", []string{"serve"}, 2, "", "need --config FILE, or --pool"},
		{"both", []string{"serve", "--config", "../../configs/minimal.yaml", "--pool", "m=http://127.0.0.1:1"}, 2, "", "either --config or --pool"},
		{"check ok", []string{"serve", "--config", "../../configs/gpurouter.example.yaml", "--check"}, 0, "configuration OK", ""},
		{"check flags", []string{"serve", "--listen", "127.0.0.1:0", "--pool", "m=http://127.0.0.1:9001,http://127.0.0.1:9002", "--policy", "round_robin", "--check"}, 0, "configuration OK", ""},
		{"check bad pool", []string{"serve", "--pool", "m=", "--check"}, 1, "", `--pool "m="`},
		{"bad policy", []string{"serve", "--pool", "m=http://127.0.0.1:1", "--policy", "fastest"}, 1, "", "unknown policy"},
		{"print config", []string{"serve", "--pool", "m=http://127.0.0.1:9001", "--print-config"}, 0, "max_attempts: 3", ""},
		{"missing file", []string{"serve", "--config", "nope.yaml", "--check"}, 1, "", "nope.yaml"},
		{"unknown command", []string{"fly"}, 2, "", "unknown command"},
		{"help", []string{"help"}, 0, "serve", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tt.args, &out, &errb)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out.String(), errb.String())
			}
			if !strings.Contains(out.String(), tt.inStdout) || !strings.Contains(errb.String(), tt.inStderr) {
				t.Fatalf("stdout %q / stderr %q lack %q / %q", out.String(), errb.String(), tt.inStdout, tt.inStderr)
			}
		})
	}
}

func TestNewRouterFromExampleConfig(t *testing.T) {
	cfg, err := loadConfigFile("../../configs/gpurouter.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	log, err := newLogger(cfg.Log, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRouter(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(r.srv.Pools()); got != len(cfg.Pools) {
		t.Fatalf("%d pools, want %d", got, len(cfg.Pools))
	}
	for i, p := range r.srv.Pools() {
		if p.Model() != cfg.Pools[i].Model || p.Policy() != cfg.Pools[i].Policy || len(p.Replicas()) != len(cfg.Pools[i].Replicas) {
			t.Errorf("pool %d: %s/%s/%d replicas from %+v", i, p.Model(), p.Policy(), len(p.Replicas()), cfg.Pools[i])
		}
	}
}

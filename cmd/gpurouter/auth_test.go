package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/proxy/auth"
	"go.uber.org/zap"
)

// testAPIKey is a client key used on command lines in these tests; it must
// never be printed.
const testAPIKey = "sk-cmd-test-3b1f9a0e7c5d4e2f8a6b"

const authPools = "pools: [{model: m, aliases: [m-alias], replicas: [{url: 'http://127.0.0.1:1'}]}]\n"

func TestAuthConfigInlineKeys(t *testing.T) {
	cfg, err := parseConfig([]byte("auth:\n  keys:\n" +
		"    - {id: a, hash: '" + auth.HashKey("key-a") + "', models: [m-alias, m], tier: 3, requests_per_minute: 60}\n" +
		"    - {id: b, hash: '" + auth.HashKey("key-b") + "'}\n" + authPools))
	if err != nil {
		t.Fatal(err)
	}
	keys, enabled, err := clientKeys(cfg)
	if err != nil || !enabled {
		t.Fatalf("clientKeys: %v (enabled %v)", err, enabled)
	}
	want := []auth.KeyConfig{
		{ID: "a", Hash: auth.HashKey("key-a"), Models: []string{"m"}, Tier: 3, RequestsPerMinute: 60}, // alias → model
		{ID: "b", Hash: auth.HashKey("key-b")},
	}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("keys %+v\nwant %+v", keys, want)
	}

	off, err := parseConfig([]byte("auth: {keys: []}\n" + authPools))
	if err != nil {
		t.Fatal(err)
	}
	if _, enabled, _ := clientKeys(off); enabled || off.Auth.Keys != nil {
		t.Fatalf("keys: [] turned auth on (%+v)", off.Auth)
	}
}

func TestAuthConfigRejects(t *testing.T) {
	tests := []struct {
		name string
		auth string
		want []string
	}{
		{"raw key as hash", "auth: {keys: [{id: a, hash: " + testAPIKey + "}]}\n", []string{"auth.keys[0].hash: must be \"sha256:\""}},
		{"duplicate id", "auth: {keys: [{id: a, hash: '" + auth.HashKey("1") + "'}, {id: a, hash: '" + auth.HashKey("2") + "'}]}\n", []string{"auth.keys[1].id: already used by auth.keys[0]"}},
		{"tier above classes", "auth: {keys: [{id: a, hash: '" + auth.HashKey("1") + "', tier: 4}]}\n", []string{"auth.keys[0].tier: must be < admission.classes (4), got 4"}},
		{"empty models", "auth: {keys: [{id: a, hash: '" + auth.HashKey("1") + "', models: []}]}\n", []string{"auth.keys[0].models: must name at least one model"}},
		{"unknown key field", "auth:\n  keys:\n    - {id: a, hash: '" + auth.HashKey("1") + "', rpm: 5}\n", []string{"auth.keys[0].rpm: unknown key at line 3", "requests_per_minute"}},
		{"unknown auth field", "auth: {key_file: x}\n", []string{"auth.key_file: unknown key at line 1", "keys_file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig([]byte(tt.auth + authPools))
			assertErrContains(t, err, tt.want)
			if err != nil && strings.Contains(err.Error(), testAPIKey) {
				t.Errorf("error quotes the key: %v", err)
			}
		})
	}
}

// writeAuthFiles writes a configuration naming keys_file keys.yaml
// (relative) and that keys file into a fresh directory; it returns the
// configuration's path.
func writeAuthFiles(t *testing.T, inline, keysFile string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "keys.yaml"), []byte(keysFile), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gpurouter.yaml")
	if err := os.WriteFile(path, []byte("auth:\n  keys_file: keys.yaml\n"+inline+authPools), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestAuthConfigKeysFile(t *testing.T) {
	path := writeAuthFiles(t, "", "- id: f\n  hash: "+auth.HashKey("key-f")+"\n  models: [m-alias]\n")
	cfg, err := loadConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(filepath.Dir(path), "keys.yaml"); cfg.Auth.KeysFile != want {
		t.Fatalf("keys_file %q, want %q (relative to the configuration)", cfg.Auth.KeysFile, want)
	}
	keys, enabled, err := clientKeys(cfg)
	if err != nil || !enabled || len(keys) != 1 || keys[0].ID != "f" || !reflect.DeepEqual(keys[0].Models, []string{"m"}) {
		t.Fatalf("keys %+v, enabled %v, err %v", keys, enabled, err)
	}

	// An empty keys file keeps auth on: nobody gets in.
	empty := writeAuthFiles(t, "", "# no keys\n")
	cfg, err = loadConfigFile(empty)
	if err != nil {
		t.Fatal(err)
	}
	if keys, enabled, err := clientKeys(cfg); err != nil || !enabled || len(keys) != 0 {
		t.Fatalf("empty keys file: %+v %v %v, want auth on without keys", keys, enabled, err)
	}

	for _, tt := range []struct {
		name, inline, file string
		want               []string
	}{
		{"bad line", "", "- id: f\n  hash: " + auth.HashKey("x") + "\n- id: g\n  hash: " + testAPIKey + "\n", []string{"keys.yaml", "line 4: keys[1].hash"}},
		{"same id inline", "  keys: [{id: f, hash: '" + auth.HashKey("y") + "'}]\n", "- id: f\n  hash: " + auth.HashKey("x") + "\n", []string{`keys[0].id: "f" is also auth.keys[0]`}},
		{"same key inline", "  keys: [{id: g, hash: '" + auth.HashKey("x") + "'}]\n", "- id: f\n  hash: " + auth.HashKey("x") + "\n", []string{"keys[0].hash: the same key as auth.keys[0]"}},
		{"tier above classes", "", "- id: f\n  hash: " + auth.HashKey("x") + "\n  tier: 9\n", []string{"keys[0].tier: must be < admission.classes (4), got 9"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadConfigFile(writeAuthFiles(t, tt.inline, tt.file))
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = clientKeys(cfg)
			assertErrContains(t, err, tt.want)
			if err != nil && strings.Contains(err.Error(), testAPIKey) {
				t.Errorf("error quotes the key: %v", err)
			}
		})
	}

	missing := writeAuthFiles(t, "", "")
	os.Remove(filepath.Join(filepath.Dir(missing), "keys.yaml"))
	var out, errb bytes.Buffer
	if code := run([]string{"serve", "--config", missing, "--check"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "auth.keys_file") {
		t.Fatalf("--check with a missing keys file: exit %d, stderr %q", code, errb.String())
	}
}

func TestAuthServeFlags(t *testing.T) {
	bad := writeAuthFiles(t, "", "- id: f\n  hash: nope\n  tier: x\n")
	tests := []struct {
		name     string
		args     []string
		code     int
		inStdout []string
		inStderr string
	}{
		{"api key printed as hash", []string{"serve", "--pool", "m=http://127.0.0.1:9001", "--api-key", testAPIKey, "--api-key", testAPIKey + "-2", "--print-config"}, 0,
			[]string{"id: flag-1", "hash: " + auth.HashKey(testAPIKey), "id: flag-2", "hash: " + auth.HashKey(testAPIKey+"-2")}, ""},
		{"api key check", []string{"serve", "--pool", "m=http://127.0.0.1:9001", "--api-key", testAPIKey, "--check"}, 0, []string{"configuration OK"}, ""},
		{"short api key", []string{"serve", "--pool", "m=http://127.0.0.1:9001", "--api-key", "sk-short", "--check"}, 2, nil, "--api-key #1: must be at least 16 characters"},
		{"hash key", []string{"serve", "--hash-key", testAPIKey}, 0, []string{auth.HashKey(testAPIKey) + "\n"}, ""},
		{"bad keys file", []string{"serve", "--config", bad, "--check"}, 1, nil, "line 2: keys[0].hash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tt.args, &out, &errb)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out.String(), errb.String())
			}
			for _, w := range tt.inStdout {
				if !strings.Contains(out.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, out.String())
				}
			}
			if !strings.Contains(errb.String(), tt.inStderr) {
				t.Errorf("stderr lacks %q: %s", tt.inStderr, errb.String())
			}
			if strings.Contains(out.String()+errb.String(), testAPIKey) || strings.Contains(out.String()+errb.String(), "sk-short") {
				t.Errorf("a key was printed:\n%s\n%s", out.String(), errb.String())
			}
			if tt.name == "api key printed as hash" {
				back, err := parseConfig(out.Bytes())
				if err != nil || len(back.Auth.Keys) != 2 {
					t.Fatalf("printed configuration does not load back with its keys: %v\n%s", err, out.String())
				}
			}
		})
	}
}

// TestAuthRouter checks the wiring: a router built from a configuration
// with keys refuses requests without one, and reloads change its keys.
func TestAuthRouter(t *testing.T) {
	cfg, err := parseConfig([]byte("auth: {keys: [{id: a, hash: '" + auth.HashKey(testAPIKey) + "', requests_per_minute: 1}]}\n" + authPools))
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRouter(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ks := r.srv.Keys()
	if ks == nil || ks.Len() != 1 {
		t.Fatalf("router keys %v", ks)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go r.srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r.srv.Shutdown(ctx) //nolint:errcheck
	})
	status := func(key string) int {
		req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/v1/models", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(""); got != 401 {
		t.Fatalf("no key: %d, want 401", got)
	}
	if got := status(testAPIKey); got != 200 {
		t.Fatalf("key: %d, want 200", got)
	}

	// Same key, more keys: the store (and its buckets) stays.
	next := cfg
	next.Auth.Keys = append(flagKeys([]string{testAPIKey + "-other"}), cfg.Auth.Keys...)
	if err := r.reload(next); err != nil {
		t.Fatal(err)
	}
	if r.srv.Keys() != ks || ks.Len() != 2 {
		t.Fatalf("reload replaced the store or lost keys: %v %d", r.srv.Keys() == ks, ks.Len())
	}
	// A broken keys file rejects the whole reload.
	broken := next
	broken.Auth.KeysFile = filepath.Join(t.TempDir(), "missing.yaml")
	if err := r.reload(broken); err == nil || ks.Len() != 2 {
		t.Fatalf("reload with a missing keys file: %v, %d keys", err, ks.Len())
	}
	// No keys: auth off.
	off := cfg
	off.Auth = authConfig{}
	if err := r.reload(off); err != nil {
		t.Fatal(err)
	}
	if r.srv.Keys() != nil || status("") != 200 {
		t.Fatal("auth still on after a reload without keys")
	}
}

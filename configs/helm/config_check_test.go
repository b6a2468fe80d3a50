package helm

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// TestChartConfigPassesCheck: the router configuration each rendering puts
// in the ConfigMap is one `gpurouter serve --check` accepts.
func TestChartConfigPassesCheck(t *testing.T) {
	helm := tool(t, "HELM", "helm")
	bin := gpurouter(t)
	for _, v := range valueSets() {
		t.Run(v.name, func(t *testing.T) {
			var cfg string
			for _, o := range split(t, render(t, helm, v)) {
				if o.kind() == "ConfigMap" {
					cfg, _ = get(o, "data", "gpurouter.yaml").(string)
				}
			}
			if cfg == "" {
				t.Fatal("no gpurouter.yaml in the ConfigMap")
			}
			path := filepath.Join(t.TempDir(), "gpurouter.yaml")
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			if out, errb, err := runErr(bin, "serve", "--config", path, "--check"); err != nil {
				t.Fatalf("gpurouter serve --check: %v\n%s%s\nconfig:\n%s", err, out, errb, cfg)
			}
		})
	}
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildOut  []byte
)

// gpurouter builds the router once per test binary, for --check.
func gpurouter(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpurouter-helm-test")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "gpurouter")
		cmd := exec.Command("go", "build", "-o", binPath, "github.com/gpurouter/gpurouter/cmd/gpurouter")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build gpurouter: %v\n%s", buildErr, buildOut)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

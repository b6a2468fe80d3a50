// Package helm tests the chart in gpurouter/: helm lint and template for
// the default values and each example, what the rendered manifests promise
// (probes, grace period, non-root, least-privilege RBAC), the rendered
// router configuration as `gpurouter serve --check` reads it, kubeconform
// against schemas generated from a real API server's OpenAPI, a server-side
// dry-run apply, and discovery running under the chart's Role.
package helm

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurouter/gpurouter/discovery/kubetest"
	"sigs.k8s.io/yaml"
)

// chartDir is the chart under test.
const chartDir = "gpurouter"

// tool finds a program in $env, PATH, then the CI cache (.ci/helm-tools
// puts helm and kubeconform there). Missing, the test skips with one line,
// or fails under CI=true, where .ci/run installs it.
func tool(t *testing.T, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" && isExecutable(p) {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := filepath.Join(kubetest.CacheDir(), name); isExecutable(p) {
		return p
	}
	msg := "no " + name + " ($" + env + ", PATH or " + kubetest.CacheDir() + "; .ci/helm-tools installs it)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// run runs a program and returns its stdout; t fails with its stderr on a
// non-zero exit.
func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	out, errb, err := runErr(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(name), strings.Join(args, " "), err, out, errb)
	}
	return out
}

func runErr(name string, args ...string) (stdout, stderr []byte, err error) {
	cmd := exec.Command(name, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.Bytes(), e.Bytes(), err
}

// valueSet is one way of installing the chart: a values file (none for the
// defaults) and --set flags.
type valueSet struct {
	name   string
	file   string // relative to the chart; "" = defaults
	sets   []string
	hasSM  bool   // renders a ServiceMonitor (a CRD the test server lacks)
	expect string // namespace → resources the Role must grant, "ns:res,res;ns:res"
}

// valueSets are the defaults, both examples, and every optional part on.
func valueSets() []valueSet {
	return []valueSet{
		{name: "defaults", expect: "gpurouter:pods"},
		{name: "vllm-pods", file: "examples/vllm-pods.yaml", hasSM: true, expect: "llm:pods"},
		{name: "inferencepool", file: "examples/inferencepool.yaml", expect: "gpurouter:inferencepools,pods"},
		{name: "everything", sets: []string{
			"autoscaling.enabled=true", "serviceMonitor.enabled=true", "podAntiAffinity=hard",
			"podDisruptionBudget.maxUnavailable=", "podDisruptionBudget.minAvailable=1",
			"config.pools[0].model=m", "config.pools[0].discovery.kubernetes.service=vllm",
			"config.pools[0].discovery.kubernetes.port=8000", "config.shutdown.drain_timeout=1m30s",
		}, hasSM: true, expect: "gpurouter:endpointslices"},
		// Tracing on, with the chart's additions (TestChartTracing).
		{name: "tracing", sets: []string{
			// (A ratio such as 0.25 must come from a values file: --set
			// makes it a string, which the router refuses.)
			"config.tracing.endpoint=http://otel-collector.observability:4318", "config.tracing.protocol=http",
			"config.tracing.timeout=5s",
			"tracing.headersSecret.name=otel-auth",
		}, expect: "gpurouter:pods"},
	}
}

func (v valueSet) args() []string {
	var a []string
	if v.file != "" {
		a = append(a, "-f", filepath.Join(chartDir, v.file))
	}
	for _, s := range v.sets {
		a = append(a, "--set", s)
	}
	return a
}

// render is `helm template gpurouter ./gpurouter -n gpurouter` with v: the
// release the test API server's service-account user belongs to.
func render(t *testing.T, helm string, v valueSet) []byte {
	t.Helper()
	args := append([]string{"template", "gpurouter", chartDir, "--namespace", "gpurouter"}, v.args()...)
	return run(t, helm, args...)
}

// object is one rendered manifest.
type object map[string]any

func (o object) kind() string { s, _ := o["kind"].(string); return s }

func (o object) name() string {
	m, _ := o["metadata"].(map[string]any)
	s, _ := m["name"].(string)
	return s
}

// split parses a multi-document YAML stream into its objects.
func split(t *testing.T, manifests []byte) []object {
	t.Helper()
	var objs []object
	for _, doc := range bytes.Split(manifests, []byte("\n---")) {
		var o object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if len(o) > 0 {
			objs = append(objs, o)
		}
	}
	return objs
}

// get walks o by keys and list indices ("spec", "template", 0 ...).
func get(o any, path ...any) any {
	if obj, ok := o.(object); ok {
		o = map[string]any(obj)
	}
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := o.(map[string]any)
			if !ok {
				return nil
			}
			o = m[k]
		case int:
			l, ok := o.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			o = l[k]
		}
	}
	return o
}

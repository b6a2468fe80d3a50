package helm

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestChartLintAndTemplate: helm lint --strict is clean and helm template
// renders for the defaults, both examples and every optional part on, and
// each rendering keeps the chart's promises.
func TestChartLintAndTemplate(t *testing.T) {
	helm := tool(t, "HELM", "helm")
	for _, v := range valueSets() {
		t.Run(v.name, func(t *testing.T) {
			out := run(t, helm, append([]string{"lint", "--strict", chartDir}, v.args()...)...)
			if !strings.Contains(string(out), "0 chart(s) failed") || strings.Contains(string(out), "[WARNING]") || strings.Contains(string(out), "[ERROR]") {
				t.Fatalf("helm lint:\n%s", out)
			}
			objs := split(t, render(t, helm, v))
			checkObjects(t, v, objs)
		})
	}
}

// checkObjects checks what every rendering must hold.
func checkObjects(t *testing.T, v valueSet, objs []object) {
	t.Helper()
	byKind := map[string][]object{}
	for _, o := range objs {
		byKind[o.kind()] = append(byKind[o.kind()], o)
	}
	for _, k := range []string{"Deployment", "Service", "ServiceAccount", "ConfigMap", "PodDisruptionBudget", "Role", "RoleBinding"} {
		if len(byKind[k]) == 0 {
			t.Errorf("no %s rendered", k)
		}
	}
	if got := len(byKind["ServiceMonitor"]) > 0; got != v.hasSM {
		t.Errorf("ServiceMonitor rendered: %v, want %v", got, v.hasSM)
	}
	if len(byKind["Deployment"]) != 1 {
		t.Fatalf("%d Deployments", len(byKind["Deployment"]))
	}
	d := byKind["Deployment"][0]
	hpa := len(byKind["HorizontalPodAutoscaler"]) > 0
	if r, ok := get(d, "spec", "replicas").(float64); hpa == ok || (!hpa && r < 2) {
		t.Errorf("replicas %v with HPA %v: want >= 2 without an HPA, unset with one", get(d, "spec", "replicas"), hpa)
	}
	if hpa && get(byKind["HorizontalPodAutoscaler"][0], "spec", "minReplicas").(float64) < 2 {
		t.Error("HPA minReplicas < 2")
	}
	pod := get(d, "spec", "template", "spec")
	if get(pod, "affinity", "podAntiAffinity") == nil {
		t.Error("no pod anti-affinity")
	}
	if get(pod, "securityContext", "runAsNonRoot") != true {
		t.Error("pod not runAsNonRoot")
	}
	c := get(pod, "containers", 0)
	if get(c, "securityContext", "readOnlyRootFilesystem") != true || get(c, "securityContext", "allowPrivilegeEscalation") != false {
		t.Errorf("container security context %v", get(c, "securityContext"))
	}
	if get(c, "livenessProbe", "httpGet", "path") != "/health" || get(c, "readinessProbe", "httpGet", "path") != "/ready" {
		t.Errorf("probes: liveness %v, readiness %v", get(c, "livenessProbe"), get(c, "readinessProbe"))
	}
	if get(c, "resources", "requests", "cpu") == nil || get(c, "resources", "requests", "memory") == nil {
		t.Errorf("resource requests %v", get(c, "resources"))
	}
	// The grace period covers the preStop sleep, the drain and a margin.
	preStop, _ := get(c, "lifecycle", "preStop", "sleep", "seconds").(float64)
	grace, _ := get(pod, "terminationGracePeriodSeconds").(float64)
	drain := 30.0
	switch v.name {
	case "vllm-pods":
		drain = 120
	case "everything":
		drain = 90
	}
	if preStop < 1 || grace != preStop+drain+5 {
		t.Errorf("preStop %v s, grace %v s: want preStop > 0 and grace = preStop + drain %v + 5", preStop, grace, drain)
	}
	checkRBAC(t, v, byKind)
}

// checkRBAC: per namespace one Role with get/list/watch on exactly the
// resources the configured discovery reads, bound to the chart's
// ServiceAccount.
func checkRBAC(t *testing.T, v valueSet, byKind map[string][]object) {
	t.Helper()
	got := map[string][]string{}
	for _, r := range byKind["Role"] {
		ns := get(r, "metadata", "namespace").(string)
		rules, _ := get(r, "rules").([]any)
		for _, rule := range rules {
			if verbs := fmt.Sprint(get(rule, "verbs")); verbs != "[get list watch]" {
				t.Errorf("Role %s/%s: verbs %s, want [get list watch] only", ns, r.name(), verbs)
			}
			group := fmt.Sprint(get(rule, "apiGroups", 0))
			for _, res := range get(rule, "resources").([]any) {
				want := map[string]string{"pods": "", "endpointslices": "discovery.k8s.io", "inferencepools": "inference.networking.k8s.io"}[res.(string)]
				if group != want {
					t.Errorf("Role %s: %s in API group %q, want %q", ns, res, group, want)
				}
				got[ns] = append(got[ns], res.(string))
			}
		}
	}
	var parts []string
	for ns, res := range got {
		slices.Sort(res)
		parts = append(parts, ns+":"+strings.Join(res, ","))
	}
	slices.Sort(parts)
	if s := strings.Join(parts, ";"); s != v.expect {
		t.Errorf("Roles grant %q, want %q", s, v.expect)
	}
	sa := byKind["ServiceAccount"][0].name()
	for _, b := range byKind["RoleBinding"] {
		if get(b, "subjects", 0, "name") != sa || get(b, "subjects", 0, "namespace") != "gpurouter" {
			t.Errorf("RoleBinding %s binds %v, want ServiceAccount gpurouter/%s", b.name(), get(b, "subjects"), sa)
		}
	}
}

// TestChartRejectsBadValues: values the chart cannot honour stop the render
// with a message naming them.
func TestChartRejectsBadValues(t *testing.T) {
	helm := tool(t, "HELM", "helm")
	tests := []struct{ set, want string }{
		{"config.shutdown.drain_timeout=30", `drain_timeout "30"`},
		{"podAntiAffinity=sometimes", `podAntiAffinity "sometimes"`},
	}
	for _, tt := range tests {
		_, errb, err := runErr(helm, "template", "gpurouter", chartDir, "--set", tt.set)
		if err == nil || !strings.Contains(string(errb), tt.want) {
			t.Errorf("--set %s: err %v, stderr %s; want it refused naming %s", tt.set, err, errb, tt.want)
		}
	}
}

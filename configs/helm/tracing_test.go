package helm

import (
	"strings"
	"testing"
)

// TestChartTracing: config.tracing passes into the router's file as
// given, and the chart's additions (the pod's identity as resource
// attributes, the headers from a Secret) are in the container's
// environment only while tracing is on; headers in both places are
// refused.
func TestChartTracing(t *testing.T) {
	helm := tool(t, "HELM", "helm")
	sets := valueSets()
	for _, v := range []valueSet{sets[0], sets[len(sets)-1]} {
		t.Run(v.name, func(t *testing.T) {
			on := v.name == "tracing"
			var cfg string
			var env map[string]any
			for _, o := range split(t, render(t, helm, v)) {
				switch o.kind() {
				case "ConfigMap":
					cfg, _ = get(o, "data", "gpurouter.yaml").(string)
				case "Deployment":
					env = envByName(get(o, "spec", "template", "spec", "containers", 0, "env"))
				}
			}
			if got := strings.Contains(cfg, "endpoint: http://otel-collector.observability:4318") &&
				strings.Contains(cfg, "protocol: http") && strings.Contains(cfg, "timeout: 5s"); got != on {
				t.Errorf("tracing in the file: %v, want %v:\n%s", got, on, cfg)
			}
			attrs, _ := get(env["OTEL_RESOURCE_ATTRIBUTES"], "value").(string)
			if on != (attrs == "k8s.pod.name=$(GPUROUTER_POD_NAME),k8s.pod.uid=$(GPUROUTER_POD_UID),"+
				"k8s.namespace.name=$(GPUROUTER_POD_NAMESPACE),k8s.node.name=$(GPUROUTER_NODE_NAME)") {
				t.Errorf("OTEL_RESOURCE_ATTRIBUTES %q with tracing %v", attrs, on)
			}
			for name, path := range map[string]string{"GPUROUTER_POD_NAME": "metadata.name", "GPUROUTER_POD_UID": "metadata.uid",
				"GPUROUTER_POD_NAMESPACE": "metadata.namespace", "GPUROUTER_NODE_NAME": "spec.nodeName"} {
				if got, _ := get(env[name], "valueFrom", "fieldRef", "fieldPath").(string); (got == path) != on {
					t.Errorf("%s from %q with tracing %v", name, got, on)
				}
			}
			ref := get(env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"], "valueFrom", "secretKeyRef")
			if on != (get(ref, "name") == "otel-auth" && get(ref, "key") == "headers") {
				t.Errorf("headers from Secret %v with tracing %v", ref, on)
			}
		})
	}

	t.Run("no pod attributes", func(t *testing.T) {
		v := sets[len(sets)-1]
		v.sets = append(v.sets[:len(v.sets):len(v.sets)], "tracing.kubernetesAttributes=false")
		for _, o := range split(t, render(t, helm, v)) {
			if o.kind() == "Deployment" {
				env := envByName(get(o, "spec", "template", "spec", "containers", 0, "env"))
				if env["OTEL_RESOURCE_ATTRIBUTES"] != nil || env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] == nil {
					t.Errorf("env %v", env)
				}
			}
		}
	})

	t.Run("headers twice", func(t *testing.T) {
		v := sets[len(sets)-1]
		args := append([]string{"template", "gpurouter", chartDir}, v.args()...)
		args = append(args, "--set", "config.tracing.headers.authorization=x")
		_, errb, err := runErr(helm, args...)
		if err == nil || !strings.Contains(string(errb), "tracing.headersSecret and config.tracing.headers") {
			t.Errorf("want the chart to refuse headers in both places; err %v: %s", err, errb)
		}
	})
}

// envByName indexes a container's env list by variable name.
func envByName(list any) map[string]any {
	out := map[string]any{}
	l, _ := list.([]any)
	for _, e := range l {
		if name, ok := get(e, "name").(string); ok {
			out[name] = e
		}
	}
	return out
}

package helm

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/gpurouter/gpurouter/discovery/kubetest"
)

// serviceMonitorSkip is why ServiceMonitors are not validated: the
// Prometheus Operator's CRD is neither served by the test API server nor
// in its OpenAPI, and the tests fetch nothing from the network.
const serviceMonitorSkip = "ServiceMonitor (monitoring.coreos.com/v1): the Prometheus Operator CRD is not installed in the test API server"

// TestChartAgainstAPIServer renders the chart for every value set and checks
// the manifests against a real kube-apiserver: kubeconform with schemas
// generated from that server's OpenAPI, then a server-side dry-run apply of
// each object.
func TestChartAgainstAPIServer(t *testing.T) {
	helm := tool(t, "HELM", "helm")
	kc := tool(t, "KUBECONFORM", "kubeconform")
	c := kubetest.Start(t)
	schemas := writeSchemas(t, c)
	t.Logf("schemas from %s's OpenAPI", c.Version)

	t.Run("kubeconform rejects what the server would", func(t *testing.T) {
		bad := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n  selector: {matchLabels: {a: b}}\n  template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: i}]}}\n")
		if out, err := kubeconform(t, kc, schemas, bad); err == nil || !strings.Contains(string(out), "replica") {
			t.Fatalf("a misspelt field passed: %v\n%s", err, out)
		}
	})
	for _, v := range valueSets() {
		manifests := render(t, helm, v)
		t.Run("kubeconform/"+v.name, func(t *testing.T) {
			var skip []string
			if v.hasSM {
				skip = append(skip, "ServiceMonitor")
				t.Log("skipped: " + serviceMonitorSkip)
			}
			out, err := kubeconform(t, kc, schemas, manifests, skip...)
			if err != nil || !strings.Contains(string(out), "Invalid: 0, Errors: 0") {
				t.Fatalf("kubeconform: %v\n%s", err, out)
			}
			t.Logf("%s", strings.TrimSpace(string(out)))
		})
	}

	createNamespaces(t, c, "gpurouter", "llm")
	apply := newApplier(t, c)
	t.Run("dry-run apply rejects what the server would", func(t *testing.T) {
		for _, o := range split(t, render(t, helm, valueSets()[0])) {
			if o.kind() == "Deployment" {
				get(o, "spec", "template", "spec", "containers", 0).(map[string]any)["name"] = "Not_A_DNS_Label"
				if err := apply(o, true); err == nil || !strings.Contains(err.Error(), "Not_A_DNS_Label") {
					t.Fatalf("an invalid container name passed the dry run: %v", err)
				}
			}
		}
	})
	for _, v := range valueSets() {
		manifests := render(t, helm, v)
		t.Run("dry-run apply/"+v.name, func(t *testing.T) {
			for _, o := range split(t, manifests) {
				if o.kind() == "ServiceMonitor" {
					t.Log("skipped: " + serviceMonitorSkip)
					continue
				}
				if err := apply(o, true); err != nil {
					t.Errorf("%s %s: %v", o.kind(), o.name(), err)
				}
			}
		})
	}
}

// createNamespaces creates namespaces as the admin.
func createNamespaces(t *testing.T, c *kubetest.Cluster, names ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range names {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}
		if _, err := c.Clientset(t).CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create namespace %s: %v", n, err)
		}
	}
}

// newApplier returns a server-side apply of one rendered object as the
// admin, in namespace gpurouter unless the object names its own; dryRun
// only validates and admits it.
func newApplier(t *testing.T, c *kubetest.Cluster) func(o object, dryRun bool) error {
	t.Helper()
	dyn := c.Dynamic(t)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Clientset(t).Discovery()))
	return func(o object, dryRun bool) error {
		u := &unstructured.Unstructured{Object: o}
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(schema.GroupKind{Group: gvk.Group, Kind: gvk.Kind}, gvk.Version)
		if err != nil {
			return err
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ns := u.GetNamespace()
			if ns == "" {
				ns = "gpurouter"
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		opts := metav1.ApplyOptions{FieldManager: "gpurouter-chart-test", Force: true}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = ri.Apply(ctx, u.GetName(), u, opts)
		return err
	}
}

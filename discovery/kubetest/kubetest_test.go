package kubetest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/discovery/kubetest"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// The harness itself: the server runs RBAC (admin may, nobody may not, both
// through a kubeconfig file as the router would read it) and serves
// InferencePools once the CRD is in.
func TestCluster(t *testing.T) {
	c := kubetest.Start(t)
	if !strings.HasPrefix(c.Version, "v1.") {
		t.Fatalf("version %q", c.Version)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Clientset(t).CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("admin list pods: %v", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.KubeconfigFor(t, kubetest.NobodyUser))
	if err != nil {
		t.Fatal(err)
	}
	nobody := kubernetes.NewForConfigOrDie(cfg)
	_, err = nobody.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("nobody list pods: %v, want Forbidden", err)
	}

	c.InstallInferencePoolCRD(t)
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1",
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": "p", "namespace": "default"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts":       []any{map[string]any{"number": int64(8000)}},
			"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	if _, err := c.Dynamic(t).Resource(kubetest.InferencePoolResource).Namespace("default").Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create InferencePool: %v", err)
	}
}

package kubetest

import (
	"context"
	_ "embed"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// InferencePoolCRD is the InferencePool CustomResourceDefinition
// (inference.networking.k8s.io/v1) as sigs.k8s.io/gateway-api-inference-extension
// v1.3.0 ships it (config/crd/bases), copied unchanged.
//
//go:embed crds/inference.networking.k8s.io_inferencepools.yaml
var InferencePoolCRD []byte

// InferencePoolResource is the InferencePool resource InferencePoolCRD
// defines.
var InferencePoolResource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallInferencePoolCRD creates InferencePoolCRD and waits (at most 30 s)
// until the server serves InferencePools.
func (c *Cluster) InstallInferencePoolCRD(t testing.TB) {
	t.Helper()
	var obj map[string]any
	if err := yaml.Unmarshal(InferencePoolCRD, &obj); err != nil {
		t.Fatalf("kubetest: InferencePool CRD: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := &unstructured.Unstructured{Object: obj}
	if _, err := c.Dynamic(t).Resource(crdResource).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: create InferencePool CRD: %v", err)
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	gv := InferencePoolResource.GroupVersion().String()
	for {
		if list, err := cs.Discovery().ServerResourcesForGroupVersion(gv); err == nil {
			for _, r := range list.APIResources {
				if r.Name == InferencePoolResource.Resource {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("kubetest: %s not served within 30s", InferencePoolResource)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

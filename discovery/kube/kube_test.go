package kube_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/discovery"
	"github.com/gpurouter/gpurouter/discovery/kube"
	"github.com/gpurouter/gpurouter/discovery/kubetest"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
)

// follow is how soon the replica set must follow a change (acceptance 1).
const follow = 2 * time.Second

// latest is a Sink keeping the last set it was given.
type latest struct {
	mu   sync.Mutex
	eps  []discovery.Endpoint
	sets int
	wake chan struct{}
}

func newLatest() *latest { return &latest{wake: make(chan struct{}, 1)} }

func (l *latest) SetEndpoints(_ context.Context, _ string, eps []discovery.Endpoint) error {
	l.mu.Lock()
	l.eps = slices.Clone(eps)
	l.sets++
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

// describe is a set in a comparable form: "name=url" plus " draining".
func describe(eps []discovery.Endpoint) string {
	var out []string
	for _, e := range eps {
		s := e.Name + "=" + e.URL
		if e.Draining {
			s += " draining"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

// expect waits until the set reads want, failing after follow; it logs
// how long the change took.
func (l *latest) expect(t *testing.T, what, want string) {
	t.Helper()
	start := time.Now()
	deadline := time.NewTimer(follow)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		got, sets := describe(l.eps), l.sets
		l.mu.Unlock()
		if sets > 0 && got == want {
			t.Logf("%s: followed in %v", what, time.Since(start).Round(time.Millisecond))
			return
		}
		select {
		case <-l.wake:
		case <-deadline.C:
			t.Fatalf("%s: set %q after %v, want %q", what, got, follow, want)
		}
	}
}

// run runs src until the test ends.
func run(t *testing.T, src discovery.Source) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func namespace(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// pods writes pods as the kubelet and scheduler would: created on a node
// (so that a delete is graceful: terminating until force-deleted), then
// with an IP and a Ready condition through the status subresource.
type pods struct {
	t  *testing.T
	cs kubernetes.Interface
	ns string
}

func (p pods) create(name string, labels map[string]string) {
	p.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:   "node-1",
			Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}},
		},
	}
	if _, err := p.cs.CoreV1().Pods(p.ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		p.t.Fatal(err)
	}
}

// status sets the pod's IP and readiness.
func (p pods) status(name, ip string, ready bool) {
	p.t.Helper()
	ctx := context.Background()
	pod, err := p.cs.CoreV1().Pods(p.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		p.t.Fatal(err)
	}
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: cond, LastTransitionTime: metav1.Now()}}
	if _, err := p.cs.CoreV1().Pods(p.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		p.t.Fatal(err)
	}
}

// terminate deletes the pod gracefully: it stays, terminating, as it does
// while its kubelet stops it.
func (p pods) terminate(name string) {
	p.t.Helper()
	grace := int64(30)
	if err := p.cs.CoreV1().Pods(p.ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		p.t.Fatal(err)
	}
}

// remove deletes the pod at once, as the kubelet does when it has stopped.
func (p pods) remove(name string) {
	p.t.Helper()
	zero := int64(0)
	if err := p.cs.CoreV1().Pods(p.ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		p.t.Fatal(err)
	}
}

func clients(t *testing.T, c *kubetest.Cluster, user string) kube.Clients {
	t.Helper()
	cl, err := kube.ClientsFor(c.ConfigFor(user))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// Acceptance 1 (the sets), against a real API server: pods, a Service's
// EndpointSlices and an InferencePool, each created, made ready, made
// not-ready or terminating, and deleted; the set follows within 2 s each
// time. Acceptance 5's other half: a user without permissions gets one
// clear error line naming what is missing, not a line per retry.
func TestKubeAgainstAPIServer(t *testing.T) {
	c := kubetest.Start(t)
	cs := c.Clientset(t)
	c.InstallInferencePoolCRD(t)
	admin := clients(t, c, kubetest.AdminUser)

	t.Run("pods", func(t *testing.T) {
		namespace(t, cs, "pods")
		p := pods{t, cs, "pods"}
		sink := newLatest()
		src, err := kube.New(kube.Config{Model: "m", Namespace: "pods", Selector: "app=vllm", Port: 8000}, admin, sink, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		run(t, src)
		sink.expect(t, "no pods", "")

		vllm := map[string]string{"app": "vllm"}
		p.create("a", vllm)
		p.create("b", vllm)
		p.create("other", map[string]string{"app": "other"})
		p.status("other", "10.9.9.9", true)
		sink.expect(t, "created, no IP yet", "")
		p.status("a", "127.0.0.2", true)
		p.status("b", "127.0.0.3", true)
		sink.expect(t, "ready", "a=http://127.0.0.2:8000, b=http://127.0.0.3:8000")
		p.status("b", "127.0.0.3", false)
		sink.expect(t, "b not ready", "a=http://127.0.0.2:8000, b=http://127.0.0.3:8000 draining")
		p.status("b", "127.0.0.3", true)
		sink.expect(t, "b ready again", "a=http://127.0.0.2:8000, b=http://127.0.0.3:8000")
		p.terminate("a")
		sink.expect(t, "a terminating", "a=http://127.0.0.2:8000 draining, b=http://127.0.0.3:8000")
		p.remove("a")
		sink.expect(t, "a deleted", "b=http://127.0.0.3:8000")
		p.remove("b")
		sink.expect(t, "b deleted", "")
	})

	t.Run("endpointslices", func(t *testing.T) {
		namespace(t, cs, "slices")
		sink := newLatest()
		src, err := kube.New(kube.Config{Model: "m", Namespace: "slices", Service: "vllm", PortName: "http"}, admin, sink, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		run(t, src)
		sink.expect(t, "no slices", "")

		// Addresses are not loopback: the API server refuses loopback
		// endpoints. Nothing dials them here.
		ctx := context.Background()
		yes, no := true, false
		port, name := int32(8000), "http"
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "vllm-abc", Namespace: "slices", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.1.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "vllm-0"}},
				{Addresses: []string{"10.1.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
			},
			Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		}
		other := slice.DeepCopy()
		other.Name, other.Labels = "other-abc", map[string]string{discoveryv1.LabelServiceName: "other"}
		if _, err := cs.DiscoveryV1().EndpointSlices("slices").Create(ctx, other, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		created, err := cs.DiscoveryV1().EndpointSlices("slices").Create(ctx, slice, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sink.expect(t, "created", "10.1.0.2:8000=http://10.1.0.2:8000 draining, vllm-0=http://10.1.0.1:8000")
		created.Endpoints[1].Conditions.Ready = &yes
		if created, err = cs.DiscoveryV1().EndpointSlices("slices").Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		sink.expect(t, "made ready", "10.1.0.2:8000=http://10.1.0.2:8000, vllm-0=http://10.1.0.1:8000")
		created.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}
		if _, err = cs.DiscoveryV1().EndpointSlices("slices").Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		sink.expect(t, "vllm-0 terminating", "10.1.0.2:8000=http://10.1.0.2:8000, vllm-0=http://10.1.0.1:8000 draining")
		if err := cs.DiscoveryV1().EndpointSlices("slices").Delete(ctx, "vllm-abc", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		sink.expect(t, "deleted", "")
	})

	t.Run("inferencepool", func(t *testing.T) {
		namespace(t, cs, "pool")
		p := pods{t, cs, "pool"}
		sink := newLatest()
		src, err := kube.New(kube.Config{Model: "m", Namespace: "pool", InferencePool: "llama"}, admin, sink, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		run(t, src)
		sink.expect(t, "no pool", "")

		p.create("a", map[string]string{"model": "llama"})
		p.create("b", map[string]string{"model": "qwen"})
		p.status("a", "127.0.0.2", true)
		p.status("b", "127.0.0.3", true)
		sink.expect(t, "pods but no pool", "")

		ctx := context.Background()
		pools := c.Dynamic(t).Resource(kubetest.InferencePoolResource).Namespace("pool")
		pool := inferencePool("llama", "pool", "llama", 8000, 8001)
		created, err := pools.Create(ctx, pool, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sink.expect(t, "pool created", "a:8000=http://127.0.0.2:8000, a:8001=http://127.0.0.2:8001")
		p.status("a", "127.0.0.2", false)
		sink.expect(t, "a not ready", "a:8000=http://127.0.0.2:8000 draining, a:8001=http://127.0.0.2:8001 draining")
		p.status("a", "127.0.0.2", true)
		sink.expect(t, "a ready", "a:8000=http://127.0.0.2:8000, a:8001=http://127.0.0.2:8001")
		if err := unstructured.SetNestedStringMap(created.Object, map[string]string{"model": "qwen"}, "spec", "selector", "matchLabels"); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedSlice(created.Object, []any{map[string]any{"number": int64(8000)}}, "spec", "targetPorts"); err != nil {
			t.Fatal(err)
		}
		if _, err := pools.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		sink.expect(t, "selector changed", "b=http://127.0.0.3:8000")
		p.terminate("b")
		sink.expect(t, "b terminating", "b=http://127.0.0.3:8000 draining")
		if err := pools.Delete(ctx, "llama", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		sink.expect(t, "pool deleted", "")
	})

	t.Run("streams", func(t *testing.T) { testStreams(t, c, cs) })

	t.Run("forbidden", func(t *testing.T) {
		for _, tc := range []struct {
			cfg  kube.Config
			want string
		}{
			{kube.Config{Model: "m", Namespace: "pods", Selector: "app=vllm", Port: 8000}, `may not list and watch pods in namespace "pods"`},
			{kube.Config{Model: "m", Namespace: "slices", Service: "vllm"}, `may not list and watch endpointslices (API group discovery.k8s.io) in namespace "slices"`},
			{kube.Config{Model: "m", Namespace: "pool", InferencePool: "llama"}, `may not list and watch inferencepools (API group inference.networking.k8s.io) in namespace "pool"`},
		} {
			reg := prometheus.NewRegistry()
			m, err := discovery.NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zap.InfoLevel)
			src, err := kube.New(tc.cfg, clients(t, c, kubetest.NobodyUser), newLatest(), m, zap.New(core))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- src.Run(ctx) }()
			// Wait for the line, then for a retry after it (the
			// informers' backoff starts at 0.8 s), then count the lines.
			deadline := time.Now().Add(20 * time.Second)
			for logs.FilterMessageSnippet(tc.want).Len() == 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			seen := failures(t, reg)
			for failures(t, reg) == seen && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no line and retry within 20s", tc.want)
			}
			lines := logs.FilterMessageSnippet(tc.want).All()
			if len(lines) != 1 {
				var all []string
				for _, e := range logs.All() {
					all = append(all, e.Message)
				}
				t.Fatalf("want one line with %q, got %d of %d lines: %q", tc.want, len(lines), logs.Len(), all)
			}
			t.Logf("%s", lines[0].Message)
		}
	})
}

// failures is gpurouter_discovery_errors_total summed.
func failures(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "gpurouter_discovery_errors_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// inferencePool is an InferencePool selecting pods labelled model=model.
func inferencePool(name, ns, model string, ports ...int64) *unstructured.Unstructured {
	var tp []any
	for _, p := range ports {
		tp = append(tp, map[string]any{"number": p})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1",
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"model": model}},
			"targetPorts":       tp,
			"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
}

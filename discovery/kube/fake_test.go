package kube_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/discovery"
	"github.com/gpurouter/gpurouter/discovery/kube"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// What pods and slices become, through client-go's fake clientset (no API
// server needed): GPU annotations, IPv6 addresses, finished pods, a slice
// port picked by number, and an endpoint that sits in two slices while the
// controller moves it.
func TestTranslationWithFakeClientset(t *testing.T) {
	ctx := context.Background()
	ready := []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	pod := func(name, ip string, phase corev1.PodPhase, ann map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{"app": "vllm"}, Annotations: ann},
			Status:     corev1.PodStatus{Phase: phase, PodIP: ip, Conditions: ready},
		}
	}
	cs := fake.NewClientset(
		pod("agent", "10.0.0.1", corev1.PodRunning, map[string]string{
			kube.AnnotationGPUAgent: "http://10.0.0.1:9401", kube.AnnotationGPUUUID: "GPU-1"}),
		pod("dcgm", "fd00::2", corev1.PodRunning, map[string]string{
			kube.AnnotationDCGM: "http://10.0.0.9:9400/metrics", kube.AnnotationGPULabel: "3"}),
		pod("plain", "10.0.0.3", corev1.PodRunning, nil),
		pod("done", "10.0.0.4", corev1.PodSucceeded, nil),
	)
	sink := newLatest()
	src, err := kube.New(kube.Config{Model: "m", Namespace: "ns", Selector: "app=vllm", Port: 8000, GPUAnnotations: true}, kube.Clients{Core: cs}, sink, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, src)
	sink.expect(t, "pods", "agent=http://10.0.0.1:8000, dcgm=http://[fd00::2]:8000, plain=http://10.0.0.3:8000")
	sink.mu.Lock()
	gpus := map[string]string{}
	for _, e := range sink.eps {
		gpus[e.Name] = e.GPU.AgentURL + " " + e.GPU.UUID + " " + e.GPU.DCGMURL + " " + e.GPU.Label
	}
	sink.mu.Unlock()
	for name, want := range map[string]string{
		"agent": "http://10.0.0.1:9401 GPU-1  ",
		"dcgm":  "  http://10.0.0.9:9400/metrics 3",
		"plain": "   ",
	} {
		if gpus[name] != want {
			t.Errorf("%s: GPU %q, want %q", name, gpus[name], want)
		}
	}

	yes, no := true, false
	metricsPort, httpPort := int32(9090), int32(8000)
	slice := func(name string, ready *bool) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ready},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "vllm-0"}}},
			Ports: []discoveryv1.EndpointPort{{Port: &metricsPort}, {Port: &httpPort}},
		}
	}
	cs2 := fake.NewClientset(slice("old", &no), slice("new", &yes))
	sliceWatch := watchStarted(cs2, "endpointslices")
	sink2 := newLatest()
	src2, err := kube.New(kube.Config{Model: "m", Namespace: "ns", Service: "vllm", Port: 8000}, kube.Clients{Core: cs2}, sink2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, src2)
	sink2.expect(t, "one endpoint in two slices, the ready copy wins", "vllm-0=http://10.0.0.5:8000")
	select {
	case <-sliceWatch:
	case <-time.After(follow):
		t.Fatal("the source never watched the slices")
	}
	if err := cs2.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "new", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sink2.expect(t, "the ready copy gone", "vllm-0=http://10.0.0.5:8000 draining")
}

// watchStarted returns a channel closed once a watch on resource has
// started. The fake clientset's watch replays the objects that exist when
// it starts, not what was deleted between the informer's list and its
// watch: a test that deletes once the list's set has arrived lost the
// delete in 1 of 40 runs (`go test -race -count=40`), so it waits for the
// watch first, as client-go's examples/fake-client does.
func watchStarted(cs *fake.Clientset, resource string) <-chan struct{} {
	started := make(chan struct{})
	var once sync.Once
	cs.PrependWatchReactor(resource, func(action clienttesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if w, ok := action.(clienttesting.WatchActionImpl); ok {
			opts = w.ListOptions
		}
		w, err := cs.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		once.Do(func() { close(started) })
		return true, w, nil
	})
	return started
}

func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  kube.Config
		ok   bool
	}{
		{"pods", kube.Config{Namespace: "n", Selector: "app=x", Port: 80}, true},
		{"service by name", kube.Config{Namespace: "n", Service: "s", PortName: "http"}, true},
		{"pool", kube.Config{Namespace: "n", InferencePool: "p", GPUAnnotations: true}, true},
		{"nothing", kube.Config{Namespace: "n"}, false},
		{"no namespace", kube.Config{Service: "s"}, false},
		{"two", kube.Config{Namespace: "n", Service: "s", InferencePool: "p"}, false},
		{"bad port", kube.Config{Namespace: "n", Service: "s", Port: 70000}, false},
	} {
		if err := tc.cfg.Check(); (err == nil) != tc.ok {
			t.Errorf("%s: Check() = %v", tc.name, err)
		}
	}
}

// refusing is a Sink that refuses its first n sets.
type refusing struct {
	*latest
	n int
}

func (r *refusing) SetEndpoints(ctx context.Context, model string, eps []discovery.Endpoint) error {
	if r.n > 0 {
		r.n--
		return errors.New("not now")
	}
	return r.latest.SetEndpoints(ctx, model, eps)
}

// A set the sink refuses is offered again without waiting for an event.
func TestRefusedSetOfferedAgain(t *testing.T) {
	cs := fake.NewClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", Labels: map[string]string{"app": "vllm"}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	})
	sink := &refusing{latest: newLatest(), n: 2}
	src, err := kube.New(kube.Config{Model: "m", Namespace: "ns", Selector: "app=vllm", Port: 8000, RetryInterval: 50 * time.Millisecond}, kube.Clients{Core: cs}, sink, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, src)
	sink.expect(t, "after two refusals", "a=http://10.0.0.1:8000")
}

// A pod's role label (ours, else llm-d's) is its endpoint's role; any
// other value is colocated.
func TestPodRoles(t *testing.T) {
	ready := []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	pod := func(name, ip string, labels map[string]string) *corev1.Pod {
		labels["app"] = "vllm"
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: labels},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, Conditions: ready},
		}
	}
	cs := fake.NewClientset(
		pod("p", "10.0.0.1", map[string]string{kube.LabelRole: "prefill"}),
		pod("d", "10.0.0.2", map[string]string{kube.LabelLLMDRole: "decode"}),
		pod("b", "10.0.0.3", map[string]string{kube.LabelRole: "both", kube.LabelLLMDRole: "decode"}),
		pod("x", "10.0.0.4", map[string]string{kube.LabelRole: "router"}),
	)
	sink := newLatest()
	src, err := kube.New(kube.Config{Model: "m", Namespace: "ns", Selector: "app=vllm", Port: 8000}, kube.Clients{Core: cs}, sink, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, src)
	sink.expect(t, "pods", "b=http://10.0.0.3:8000, d=http://10.0.0.2:8000, p=http://10.0.0.1:8000, x=http://10.0.0.4:8000")
	sink.mu.Lock()
	defer sink.mu.Unlock()
	want := map[string]string{"p": "prefill", "d": "decode", "b": "both", "x": ""}
	for _, e := range sink.eps {
		if e.Role != want[e.Name] {
			t.Errorf("%s: role %q, want %q", e.Name, e.Role, want[e.Name])
		}
	}
}

package helm

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gpurouter/gpurouter/bench"
	"github.com/gpurouter/gpurouter/discovery/kubetest"
)

// TestChartRBACIsLeastPrivilege runs the router, as the chart configures
// it, under the chart's own ServiceAccount, Role and RoleBinding on a real
// API server (as the service account's user, through a kubeconfig): for
// pods by label in another namespace (examples/vllm-pods.yaml), an
// InferencePool (examples/inferencepool.yaml) and a Service's
// EndpointSlices, discovery finds the engine the test creates. Then, with
// the RoleBinding deleted, the router says which permission it misses.
func TestChartRBACIsLeastPrivilege(t *testing.T) {
	helm := tool(t, "HELM", "helm")
	bin := gpurouter(t)
	c := kubetest.Start(t)
	createNamespaces(t, c, "gpurouter", "llm")
	c.InstallInferencePoolCRD(t)
	apply := newApplier(t, c)
	cs := c.Clientset(t)
	kubeconfig := c.KubeconfigFor(t, kubetest.ServiceAccountUser)

	cases := []struct {
		values   valueSet
		engine   func(t *testing.T, ip string) // creates the engine discovery must find
		missing  []string                      // what the error must name without the RoleBinding
		bindings string                        // namespace of the RoleBinding
	}{
		{valueSets()[1], func(t *testing.T, ip string) {
			readyPod(t, cs, "llm", "vllm-0", map[string]string{"app": "vllm", "model": "llama-3.1-8b"}, ip)
		}, []string{"list and watch pods in namespace", "llm"}, "llm"},
		{valueSets()[2], func(t *testing.T, ip string) {
			readyPod(t, cs, "gpurouter", "qwen-0", map[string]string{"app": "qwen"}, ip)
			pool := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
				"metadata": map[string]any{"name": "qwen-pool", "namespace": "gpurouter"},
				"spec": map[string]any{
					"selector":          map[string]any{"matchLabels": map[string]any{"app": "qwen"}},
					"targetPorts":       []any{map[string]any{"number": int64(8000)}},
					"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}},
				},
			}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := c.Dynamic(t).Resource(kubetest.InferencePoolResource).Namespace("gpurouter").Create(ctx, pool, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}, []string{"list and watch inferencepools", "gpurouter"}, "gpurouter"},
		{valueSets()[3], func(t *testing.T, ip string) {
			endpointSlice(t, cs, "gpurouter", "vllm", ip)
		}, []string{"list and watch endpointslices", "gpurouter"}, "gpurouter"},
	}
	for i, tc := range cases {
		t.Run(tc.values.name, func(t *testing.T) {
			var cfg []byte
			for _, o := range split(t, render(t, helm, tc.values)) {
				switch o.kind() {
				case "ServiceAccount", "Role", "RoleBinding":
					if err := apply(o, false); err != nil {
						t.Fatalf("apply %s %s: %v", o.kind(), o.name(), err)
					}
				case "ConfigMap":
					cfg = []byte(get(o, "data", "gpurouter.yaml").(string))
				}
			}
			cfgPath := routerConfig(t, cfg, kubeconfig)
			// TEST-NET-1: nothing answers there, and the API server takes
			// it (it refuses loopback endpoint addresses).
			ip := fmt.Sprintf("192.0.2.%d", 10+i)
			tc.engine(t, ip)

			r := startRouter(t, bin, cfgPath)
			want := "http://" + ip + ":8000"
			if err := r.waitReplica(want, 20*time.Second); err != nil {
				t.Fatalf("under the chart's Role: %v\nrouter log:\n%s", err, r.log())
			}
			r.stop()

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := cs.RbacV1().RoleBindings(tc.bindings).Delete(ctx, "gpurouter-discovery", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			r = startRouter(t, bin, cfgPath)
			deadline := time.Now().Add(20 * time.Second)
			for !r.logged(append([]string{"permission missing"}, tc.missing...)...) {
				if time.Now().After(deadline) {
					t.Fatalf("without the RoleBinding: no error naming %v within 20s\nrouter log:\n%s", tc.missing, r.log())
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err := r.waitReplica(want, 0); err == nil {
				t.Fatal("without the RoleBinding the router still found the engine")
			}
			t.Logf("without the RoleBinding: %s", r.line("permission missing"))
			r.stop()
		})
	}
}

// routerConfig writes the chart's router configuration with the test's
// kubeconfig (the service account's token) in every Kubernetes source and
// a loopback listener.
func routerConfig(t *testing.T, cfg []byte, kubeconfig string) string {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(cfg, &m); err != nil {
		t.Fatal(err)
	}
	m["listen"] = "127.0.0.1:" + freePort(t)
	for _, p := range m["pools"].([]any) {
		if k, ok := get(p, "discovery", "kubernetes").(map[string]any); ok {
			k["kubeconfig"] = kubeconfig
		}
	}
	b, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "gpurouter.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// router is a `gpurouter serve` process.
type router struct {
	t    *testing.T
	cmd  *exec.Cmd
	url  string
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

func (r *router) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.Write(p)
}

func (r *router) log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// logged reports whether one log line contains every one of words.
func (r *router) logged(words ...string) bool { return r.line(words...) != "" }

func (r *router) line(words ...string) string {
next:
	for _, l := range strings.Split(r.log(), "\n") {
		for _, w := range words {
			if !strings.Contains(l, w) {
				continue next
			}
		}
		return l
	}
	return ""
}

func startRouter(t *testing.T, bin, cfgPath string) *router {
	t.Helper()
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	r := &router{t: t, url: "http://" + m["listen"].(string), done: make(chan struct{})}
	r.cmd = exec.Command(bin, "serve", "--config", cfgPath)
	r.cmd.Stdout, r.cmd.Stderr = r, r
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.cmd.Wait(); close(r.done) }() //nolint:errcheck // the exit is judged by stop
	t.Cleanup(r.stop)
	return r
}

// stop ends the router (SIGTERM, then SIGKILL after 10 s); idempotent.
func (r *router) stop() {
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Signal(os.Interrupt)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// waitReplica polls GET /debug/pools until a replica has url, for at most
// d (0: one look).
func (r *router) waitReplica(url string, d time.Duration) error {
	api := &bench.RouterAPI{Timeout: time.Second}
	deadline := time.Now().Add(d)
	var last string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		pools, err := api.Pools(ctx, r.url)
		cancel()
		if err == nil {
			last = fmt.Sprint(pools)
			for _, p := range pools {
				for _, rep := range p.Replicas {
					if rep.URL == url {
						return nil
					}
				}
			}
		} else {
			last = err.Error()
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("no replica %s in /debug/pools (last: %s)", url, last)
		}
		select {
		case <-r.done:
			return fmt.Errorf("router exited before a replica %s appeared", url)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readyPod creates a running, ready pod with labels and IP ip, as the
// kubelet would report it (no kubelet runs in the test cluster).
func readyPod(t *testing.T, cs kubernetes.Interface, ns, name string, labels map[string]string, ip string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}}}}},
	}
	p, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
	}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// endpointSlice creates Service svc's EndpointSlice with one ready
// endpoint at ip:8000, as the EndpointSlice controller would.
func endpointSlice(t *testing.T, cs kubernetes.Interface, ns, svc, ip string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ready, port, name := true, int32(8000), "http"
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-abc", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

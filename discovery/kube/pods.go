package kube

import (
	"context"
	"github.com/gpurouter/gpurouter/discovery"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// podWatcher is Config.Selector: the pods the selector matches, on
// Port.
type podWatcher struct {
	k    *Source
	pods podInformer
}

func (w *podWatcher) start(ctx context.Context, changed func(), onErr func(string) cache.WatchErrorHandlerWithContext) (func(), error) {
	return w.pods.start(ctx, w.k, w.k.cfg.Selector, changed, onErr)
}

func (w *podWatcher) synced() bool { return w.pods.synced() }

func (w *podWatcher) endpoints() []discovery.Endpoint {
	var eps []discovery.Endpoint
	ports := []int{w.k.cfg.Port}
	for _, obj := range w.pods.inf.GetStore().List() {
		if pod, ok := obj.(*corev1.Pod); ok {
			eps = podEndpoints(eps, pod, ports, w.k.cfg)
		}
	}
	return eps
}

// podInformer watches the pods of the source's namespace that selector
// matches ("" = all).
type podInformer struct {
	inf cache.SharedIndexInformer
	reg cache.ResourceEventHandlerRegistration
}

func (p *podInformer) start(ctx context.Context, k *Source, selector string, changed func(), onErr func(string) cache.WatchErrorHandlerWithContext) (func(), error) {
	f := informers.NewSharedInformerFactoryWithOptions(k.clients.Core, 0,
		informers.WithNamespace(k.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	p.inf = f.Core().V1().Pods().Informer()
	if err := p.inf.SetWatchErrorHandlerWithContext(onErr(resourcePods)); err != nil {
		return nil, err
	}
	var err error
	if p.reg, err = p.inf.AddEventHandler(notify(changed)); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	return f.Shutdown, nil
}

func (p *podInformer) synced() bool { return p.reg != nil && p.reg.HasSynced() }

// notify is an event handler that calls changed on every event.
func notify(changed func()) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		UpdateFunc: func(any, any) { changed() },
		DeleteFunc: func(any) { changed() },
	}
}

// podRole is a pod's role in prefill/decode disaggregation from its
// labels (LabelRole, else LabelLLMDRole): prefill, decode, both, or ""
// for anything else.
func podRole(labels map[string]string) string {
	r, ok := labels[LabelRole]
	if !ok {
		r = labels[LabelLLMDRole]
	}
	switch r {
	case "prefill", "decode", "both":
		return r
	}
	return ""
}

// podEndpoints appends pod's endpoints, one per port, to eps: none while
// it has no IP or has finished; draining while it is terminating or not
// ready.
func podEndpoints(eps []discovery.Endpoint, pod *corev1.Pod, ports []int, cfg Config) []discovery.Endpoint {
	ip := pod.Status.PodIP
	if ip == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return eps
	}
	draining := pod.DeletionTimestamp != nil || !podReady(pod)
	var g discovery.GPU
	if cfg.GPUAnnotations {
		a := pod.Annotations
		g = discovery.GPU{AgentURL: a[AnnotationGPUAgent], DCGMURL: a[AnnotationDCGM], UUID: a[AnnotationGPUUUID], Label: a[AnnotationGPULabel]}
		if g.AgentURL != "" {
			g.DCGMURL = "" // one source: the agent, which knows its own GPUs
		}
		if g.AgentURL == "" && g.DCGMURL == "" {
			g = discovery.GPU{}
		}
	}
	for _, port := range ports {
		name := pod.Name
		if len(ports) > 1 {
			name += ":" + strconv.Itoa(port)
		}
		eps = append(eps, discovery.Endpoint{Name: name, URL: cfg.Scheme + "://" + discovery.HostPort(ip, port), Draining: draining, GPU: g,
			Role: podRole(pod.Labels)})
	}
	return eps
}

// podReady is the pod's Ready condition: its readiness probes pass.
func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

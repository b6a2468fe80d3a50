package kube

import (
	"context"
	"github.com/gpurouter/gpurouter/discovery"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// poolWatcher is Config.InferencePool: the pods its selector matches
// (all pods of the namespace are watched, so that a changed selector needs
// no new watch), on each of its target ports.
type poolWatcher struct {
	k    *Source
	pods podInformer
	inf  cache.SharedIndexInformer
	reg  cache.ResourceEventHandlerRegistration
}

func (w *poolWatcher) start(ctx context.Context, changed func(), onErr func(string) cache.WatchErrorHandlerWithContext) (func(), error) {
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(w.k.clients.Dynamic, 0, w.k.cfg.Namespace,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.k.cfg.InferencePool).String()
		})
	w.inf = f.ForResource(InferencePoolResource).Informer()
	if err := w.inf.SetWatchErrorHandlerWithContext(onErr(resourceInferencePools)); err != nil {
		return nil, err
	}
	var err error
	if w.reg, err = w.inf.AddEventHandler(notify(changed)); err != nil {
		return nil, err
	}
	waitPods, err := w.pods.start(ctx, w.k, "", changed, onErr)
	if err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	return func() { f.Shutdown(); waitPods() }, nil
}

func (w *poolWatcher) synced() bool { return w.reg != nil && w.reg.HasSynced() && w.pods.synced() }

func (w *poolWatcher) endpoints() []discovery.Endpoint {
	eps := []discovery.Endpoint{}
	obj, ok, _ := w.inf.GetStore().GetByKey(w.k.cfg.Namespace + "/" + w.k.cfg.InferencePool)
	if !ok {
		return eps
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return eps
	}
	sel, ports := poolSpec(u)
	if sel == nil || len(ports) == 0 {
		return eps
	}
	for _, o := range w.pods.inf.GetStore().List() {
		if pod, ok := o.(*corev1.Pod); ok && sel.Matches(labels.Set(pod.Labels)) {
			eps = podEndpoints(eps, pod, ports, w.k.cfg)
		}
	}
	return eps
}

// poolSpec reads an InferencePool's spec.selector.matchLabels and
// spec.targetPorts[].number; a nil selector when it has none (an empty
// selector would match every pod).
func poolSpec(u *unstructured.Unstructured) (labels.Selector, []int) {
	match, _, _ := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if len(match) == 0 {
		return nil, nil
	}
	raw, _, _ := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	var ports []int
	for _, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			continue
		}
		switch n := m["number"].(type) {
		case int64:
			ports = append(ports, int(n))
		case float64:
			ports = append(ports, int(n))
		}
	}
	return labels.SelectorFromSet(match), ports
}

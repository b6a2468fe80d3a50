package kube

import (
	"context"
	"github.com/gpurouter/gpurouter/discovery"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// sliceWatcher is Config.Service: the endpoints of the Service's
// EndpointSlices.
type sliceWatcher struct {
	k   *Source
	inf cache.SharedIndexInformer
	reg cache.ResourceEventHandlerRegistration
}

func (w *sliceWatcher) start(ctx context.Context, changed func(), onErr func(string) cache.WatchErrorHandlerWithContext) (func(), error) {
	f := informers.NewSharedInformerFactoryWithOptions(w.k.clients.Core, 0,
		informers.WithNamespace(w.k.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=" + w.k.cfg.Service
		}))
	w.inf = f.Discovery().V1().EndpointSlices().Informer()
	if err := w.inf.SetWatchErrorHandlerWithContext(onErr(resourceEndpointSlices)); err != nil {
		return nil, err
	}
	var err error
	if w.reg, err = w.inf.AddEventHandler(notify(changed)); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	return f.Shutdown, nil
}

func (w *sliceWatcher) synced() bool { return w.reg != nil && w.reg.HasSynced() }

func (w *sliceWatcher) endpoints() []discovery.Endpoint {
	byName := map[string]int{} // name → index in eps
	var eps []discovery.Endpoint
	for _, obj := range w.inf.GetStore().List() {
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		port, ok := slicePort(s, w.k.cfg)
		if !ok {
			continue
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			host := discovery.HostPort(e.Addresses[0], port)
			name := host
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" && e.TargetRef.Name != "" {
				name = e.TargetRef.Name
			}
			// Ready nil means ready (the API's rule); a terminating
			// endpoint is never ready for new requests.
			ready := (e.Conditions.Ready == nil || *e.Conditions.Ready) &&
				(e.Conditions.Terminating == nil || !*e.Conditions.Terminating)
			ep := discovery.Endpoint{Name: name, URL: w.k.cfg.Scheme + "://" + host, Draining: !ready}
			// The same endpoint may sit in two slices while the
			// controller moves it; the ready copy wins.
			if i, dup := byName[name]; dup {
				if eps[i].Draining && ready {
					eps[i] = ep
				}
				continue
			}
			byName[name] = len(eps)
			eps = append(eps, ep)
		}
	}
	return eps
}

// slicePort is the port of s the pool uses: the one named cfg.PortName,
// else the one numbered cfg.Port, else s's only port.
func slicePort(s *discoveryv1.EndpointSlice, cfg Config) (int, bool) {
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		switch {
		case cfg.PortName != "":
			if p.Name != nil && *p.Name == cfg.PortName {
				return int(*p.Port), true
			}
		case cfg.Port != 0:
			if int(*p.Port) == cfg.Port {
				return cfg.Port, true
			}
		case len(s.Ports) == 1:
			return int(*p.Port), true
		}
	}
	return 0, false
}

package main

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/gpurouter/gpurouter/discovery"
	"github.com/gpurouter/gpurouter/discovery/kube"
	"github.com/gpurouter/gpurouter/fleet"
	"github.com/gpurouter/gpurouter/gpu"
)

// discoveryConfig is where a pool's replicas come from instead of its
// replicas list: exactly one of DNS and Kubernetes. A pool with discovery
// lists no replicas; it may have none for a while (its requests get 503).
type discoveryConfig struct {
	DNS        *dnsDiscoveryConfig  `yaml:"dns,omitempty"`
	Kubernetes *kubeDiscoveryConfig `yaml:"kubernetes,omitempty"`
}

// dnsDiscoveryConfig: every address (A/AAAA) a name resolves to is a
// replica, re-resolved every interval.
type dnsDiscoveryConfig struct {
	Name     string        `yaml:"name"`     // e.g. a headless Service's vllm.llm.svc.cluster.local; required
	Port     int           `yaml:"port"`     // the engines' port; required
	Interval time.Duration `yaml:"interval"` // default 5s
	Scheme   string        `yaml:"scheme"`   // http|https; default http
}

// kubeDiscoveryConfig: replicas from the Kubernetes API (watched), by
// exactly one of selector (pods), service (its EndpointSlices) and
// inference_pool.
type kubeDiscoveryConfig struct {
	Kubeconfig     string `yaml:"kubeconfig"`      // "" = in-cluster (the pod's service account); default ""
	Namespace      string `yaml:"namespace"`       // default: the router's own namespace in a cluster, else "default"
	Selector       string `yaml:"selector"`        // pods by label selector, e.g. app=vllm; needs port
	Port           int    `yaml:"port"`            // pods' port with selector; the slice port number with service (optional)
	Service        string `yaml:"service"`         // a Service whose EndpointSlices are the replicas
	PortName       string `yaml:"port_name"`       // with service: the slice port of this name; default: the only port
	InferencePool  string `yaml:"inference_pool"`  // an InferencePool (inference.networking.k8s.io/v1) in the namespace
	Scheme         string `yaml:"scheme"`          // http|https; default http
	GPUAnnotations bool   `yaml:"gpu_annotations"` // read each pod's GPU source from its gpurouter.io/* annotations; default false
}

// applyDiscoveryDefaults fills pc's discovery defaults.
func applyDiscoveryDefaults(pc *poolConfig) {
	if len(pc.Replicas) == 0 {
		pc.Replicas = nil // "replicas: []" and none are the same configuration
	}
	d := pc.Discovery
	if d == nil {
		return
	}
	if d.DNS != nil {
		setDuration(&d.DNS.Interval, discovery.DefaultDNSInterval)
		setString(&d.DNS.Scheme, "http")
	}
	if k := d.Kubernetes; k != nil {
		if k.Namespace == "" {
			k.Namespace = kube.InClusterNamespace()
		}
		setString(&k.Namespace, "default")
		setString(&k.Scheme, "http")
	}
}

// discovery checks each pool's discovery.
func (v *validator) discovery(pools []poolConfig) {
	for i, p := range pools {
		d := p.Discovery
		if d == nil {
			continue
		}
		at := fmt.Sprintf("pools[%d].discovery", i)
		if (d.DNS == nil) == (d.Kubernetes == nil) {
			v.add(at, "set exactly one of dns and kubernetes")
		}
		if len(p.Replicas) > 0 {
			v.add(fmt.Sprintf("pools[%d].replicas", i), "must be empty with discovery (discovery sets the replicas)")
		}
		if c := d.DNS; c != nil {
			if strings.TrimSpace(c.Name) == "" {
				v.add(at+".dns.name", "required")
			}
			if c.Port < 1 || c.Port > 65535 {
				v.add(at+".dns.port", "must be 1-65535, got %d", c.Port)
			}
			v.positive(at+".dns.interval", c.Interval)
			v.oneOf(at+".dns.scheme", c.Scheme, []string{"http", "https"})
		}
		if c := d.Kubernetes; c != nil {
			if err := kubeConfig(p.Model, *c).Check(); err != nil {
				for _, e := range strings.Split(err.Error(), "\n") {
					v.add(at+".kubernetes", "%s", e)
				}
			}
			v.oneOf(at+".kubernetes.scheme", c.Scheme, []string{"http", "https"})
		}
	}
}

func kubeConfig(model string, c kubeDiscoveryConfig) kube.Config {
	return kube.Config{
		Model: model, Namespace: c.Namespace, Selector: c.Selector, Port: c.Port,
		Service: c.Service, PortName: c.PortName, InferencePool: c.InferencePool,
		Scheme: c.Scheme, GPUAnnotations: c.GPUAnnotations,
	}
}

// dnsPool is the pool of a `--pool MODEL=dns://NAME:PORT` flag.
func dnsPool(model, raw string) (poolConfig, error) {
	name, port, err := discovery.ParseDNSURL(raw)
	if err != nil {
		return poolConfig{}, err
	}
	return poolConfig{Model: model, Discovery: &discoveryConfig{DNS: &dnsDiscoveryConfig{Name: name, Port: port}}}, nil
}

// discoveredGPU builds the GPU source a discovered pod's annotations name,
// checked as a gpu binding in the file would be.
func (r *router) discoveredGPU(g discovery.GPU) (gpu.Source, error) {
	gc := gpuConfig{AgentURL: g.AgentURL, DCGMURL: g.DCGMURL, UUID: g.UUID, Label: g.Label}
	var v validator
	v.gpu("gpu", gc)
	if err := errors.Join(v.errs...); err != nil {
		return nil, err
	}
	return r.gpus.source(gc)
}

// discoverySources builds a source per pool with discovery, each handing
// its sets to the fleet. Kubernetes clients are shared per kubeconfig.
// Nothing starts: each is a runner for serve.
func (r *router) discoverySources(cfg fileConfig) ([]runner, error) {
	var out []runner
	var m *discovery.Metrics
	clients := map[string]kube.Clients{}
	for i, pc := range cfg.Pools {
		d := pc.Discovery
		if d == nil {
			continue
		}
		if m == nil {
			var err error
			if m, err = discovery.NewMetrics(r.reg); err != nil {
				return nil, err
			}
		}
		at := fmt.Sprintf("pools[%d].discovery", i)
		switch {
		case d.DNS != nil:
			src, err := discovery.NewDNS(discovery.DNSConfig{
				Model: pc.Model, Name: d.DNS.Name, Port: d.DNS.Port, Scheme: d.DNS.Scheme, Interval: d.DNS.Interval,
			}, nil, r.fleet, m, r.log)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", at, err)
			}
			out = append(out, src)
		case d.Kubernetes != nil:
			c, ok := clients[d.Kubernetes.Kubeconfig]
			if !ok {
				var err error
				if c, err = kube.NewClients(d.Kubernetes.Kubeconfig); err != nil {
					return nil, fmt.Errorf("%s.kubernetes: %w", at, err)
				}
				clients[d.Kubernetes.Kubeconfig] = c
			}
			src, err := kube.New(kubeConfig(pc.Model, *d.Kubernetes), c, r.fleet, m, r.log)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", at, err)
			}
			out = append(out, src)
		}
	}
	return out, nil
}

// keepDiscovered gives the discovered pools of next the replicas cur has
// for them: a reload reads no replicas for them from the file, and must
// not empty them until discovery speaks again.
func keepDiscovered(next *fleet.Spec, cur fleet.Spec) {
	for i := range next.Pools {
		p := &next.Pools[i]
		if !p.Discovered {
			continue
		}
		for _, old := range cur.Pools {
			if old.Model == p.Model && old.Discovered {
				p.Replicas = old.Replicas
			}
		}
	}
}

// discoveries is each pool's discovery by model, to tell whether a reload
// changed one (which takes effect at restart: the sources run from start).
func discoveries(cfg fileConfig) map[string]discoveryConfig {
	out := map[string]discoveryConfig{}
	for _, p := range cfg.Pools {
		if p.Discovery != nil {
			out[p.Model] = *p.Discovery
		}
	}
	return out
}

// sameDiscovery reports whether a and b discover the same replicas.
func sameDiscovery(a, b fileConfig) bool { return reflect.DeepEqual(discoveries(a), discoveries(b)) }

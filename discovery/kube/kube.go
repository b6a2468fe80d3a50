// Package kube is Kubernetes discovery: a pool's replicas from pods by
// label selector, a Service's EndpointSlices, or an InferencePool (the
// Gateway API Inference Extension's selector over model-server pods and
// their target ports), watched through client-go informers. Ready
// endpoints take requests; terminating or not-ready ones drain; deleted
// ones are removed. RBAC needed: get, list and watch on the one resource
// a pool watches (pods; endpointslices; inferencepools and pods), in its
// namespace.
package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gpurouter/gpurouter/discovery"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// ErrForbidden is what a source meets when its credentials lack a
// permission it needs; the log line wrapping it names the permission.
var ErrForbidden = errors.New("discovery: permission missing")

// InferencePoolResource is the Gateway API Inference Extension's
// InferencePool (sigs.k8s.io/gateway-api-inference-extension, v1): a label
// selector over model-server pods and the ports they serve on.
var InferencePoolResource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// Config is a pool whose replicas come from the Kubernetes API. Exactly
// one of Selector, Service and InferencePool says which.
type Config struct {
	Model     string // the pool's model; required
	Namespace string // where the pods, Service or InferencePool live; required

	// Selector selects the engines' pods by label (`app=vllm,tier in
	// (a,b)`), on Port (required with it).
	Selector string
	// Port is the pods' port with Selector; with Service, the number of
	// the slice port to use (0: by PortName, or the slice's only port).
	Port int
	// Service takes the endpoints of this Service's EndpointSlices (label
	// kubernetes.io/service-name). The slice port used is the one named
	// PortName, else the one numbered Port, else the slice's only port.
	Service  string
	PortName string
	// InferencePool takes the pods its selector matches, on each of its
	// target ports.
	InferencePool string

	// Scheme of the replicas' URLs; "" means http.
	Scheme string
	// GPUAnnotations reads each pod's GPU telemetry source from its
	// annotations (AnnotationGPUAgent or AnnotationDCGM, with
	// AnnotationGPUUUID or AnnotationGPULabel); pods and InferencePool only
	// (EndpointSlices carry no annotations).
	GPUAnnotations bool
	// RetryInterval is how long a set the sink refused waits to be offered
	// again when no event comes first; zero means DefaultRetryInterval.
	RetryInterval time.Duration
}

// Pod annotations naming a replica's GPU telemetry source, read with
// Config.GPUAnnotations.
const (
	AnnotationGPUAgent = "gpurouter.io/gpu-agent-url" // a `gpurouter agent` URL, e.g. http://10.0.0.7:9401; with a UUID
	AnnotationDCGM     = "gpurouter.io/dcgm-url"      // a DCGM exporter's /metrics URL; with a label or a UUID
	AnnotationGPUUUID  = "gpurouter.io/gpu-uuid"      // the pod's GPU
	AnnotationGPULabel = "gpurouter.io/gpu-label"     // which of the exporter's GPUs are the pod's: indexes or UUIDs, e.g. "0,1"
)

// Pod labels that give a replica its role in prefill/decode
// disaggregation (discovery.Endpoint.Role): prefill, decode or both, as
// its vLLM kv_role; any other value, or none, is colocated. LabelRole
// first, else llm-d's own label, so pods labelled for llm-d need no other.
const (
	LabelRole     = "gpurouter.io/role"
	LabelLLMDRole = "llm-d.ai/role"
)

// Check reports what is wrong with c, or nil.
func (c Config) Check() error {
	var errs []error
	n := 0
	for _, s := range []string{c.Selector, c.Service, c.InferencePool} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		errs = append(errs, errors.New("exactly one of selector, service and inference_pool is required"))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("namespace: required"))
	}
	if c.Selector != "" {
		if _, err := labels.Parse(c.Selector); err != nil {
			errs = append(errs, fmt.Errorf("selector: %v", err))
		}
		if c.Port < 1 || c.Port > 65535 {
			errs = append(errs, fmt.Errorf("port: 1-65535 required with selector, got %d", c.Port))
		}
	} else if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("port: must be 0-65535, got %d", c.Port))
	}
	if c.PortName != "" && c.Service == "" {
		errs = append(errs, errors.New("port_name: only with service"))
	}
	if c.GPUAnnotations && c.Service != "" {
		errs = append(errs, errors.New("gpu_annotations: EndpointSlices carry no pod annotations; use selector or inference_pool"))
	}
	return errors.Join(errs...)
}

// Clients are the API clients a Source uses; Dynamic is needed for
// InferencePools only.
type Clients struct {
	Core    kubernetes.Interface
	Dynamic dynamic.Interface
}

// NewClients builds clients from a kubeconfig file, or from the pod's
// service account (in-cluster) when path is "".
func NewClients(path string) (Clients, error) {
	var cfg *rest.Config
	var err error
	if path == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	}
	if err != nil {
		return Clients{}, fmt.Errorf("discovery: kubernetes client configuration: %w", err)
	}
	return ClientsFor(cfg)
}

// ClientsFor builds clients from cfg.
func ClientsFor(cfg *rest.Config) (Clients, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "gpurouter"
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return Clients{}, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Clients{}, err
	}
	return Clients{Core: core, Dynamic: dyn}, nil
}

// InClusterNamespace is the namespace of the pod the router runs in, or ""
// outside a cluster.
func InClusterNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Source watches the Kubernetes objects its Config names through
// informers and publishes the replica set each change makes: ready
// endpoints take requests, terminating or not-ready ones drain, deleted
// ones are removed. Build with New; the zero value is unusable.
type Source struct {
	cfg     Config
	clients Clients
	pub     *discovery.Publisher
	log     *zap.Logger

	// mu guards denied: the resources whose list or watch was refused,
	// each logged once until it works again.
	mu     sync.Mutex
	denied map[string]bool
}

// New builds the source (cfg checked); nil log means none. It starts
// nothing.
func New(cfg Config, c Clients, sink discovery.Sink, m *discovery.Metrics, log *zap.Logger) (*Source, error) {
	if err := cfg.Check(); err != nil {
		return nil, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	if cfg.Model == "" {
		return nil, errors.New("discovery: kubernetes: model required")
	}
	if c.Core == nil || (cfg.InferencePool != "" && c.Dynamic == nil) {
		return nil, errors.New("discovery: kubernetes: no API client")
	}
	if cfg.Scheme == "" {
		cfg.Scheme = "http"
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Source{cfg: cfg, clients: c, pub: discovery.NewPublisher(cfg.Model, "kubernetes", sink, m, log), log: log, denied: map[string]bool{}}, nil
}

// watcher is one way of turning watched objects into endpoints: pods,
// EndpointSlices, an InferencePool and its pods.
type watcher interface {
	// start registers the informers, calling changed on every event, and
	// starts them; they stop when ctx ends, and wait returns once they
	// have.
	start(ctx context.Context, changed func(), onErr func(resource string) cache.WatchErrorHandlerWithContext) (wait func(), err error)
	// synced reports whether every informer has its initial list.
	synced() bool
	// endpoints computes the set from the informers' caches.
	endpoints() []discovery.Endpoint
}

// Run watches until ctx ends. The first set is published once every
// informer has listed; after that, each event recomputes the set and
// publishes it if it differs. One Run at a time: a second would publish
// beside the first.
func (k *Source) Run(ctx context.Context) error {
	var w watcher
	switch {
	case k.cfg.Selector != "":
		w = &podWatcher{k: k}
	case k.cfg.Service != "":
		w = &sliceWatcher{k: k}
	default:
		w = &poolWatcher{k: k}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := make(chan struct{}, 1)
	changed := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	wait, err := w.start(ctx, changed, k.onError)
	if err != nil {
		return err
	}
	defer wait()
	// Until the informers have listed, poll for it too: the last initial
	// event may come before they count as synced. A set the sink refuses
	// is offered again after cfg.RetryInterval if no event comes first.
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	watching := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-retry.C:
		case <-poll.C:
		}
		if !w.synced() {
			continue
		}
		k.working()
		if !watching {
			watching = true
			poll.Stop()
			k.log.Info("discovery: watching", zap.String("model", k.cfg.Model), zap.String("namespace", k.cfg.Namespace),
				zap.String("what", k.describe()))
		}
		retry.Stop()
		if err := k.pub.Publish(ctx, w.endpoints()); err != nil {
			retry.Reset(k.cfg.RetryInterval)
		}
	}
}

// DefaultRetryInterval is Config.RetryInterval's default.
const DefaultRetryInterval = 10 * time.Second

// describe names what the source watches, for logs.
func (k *Source) describe() string {
	switch {
	case k.cfg.Selector != "":
		return "pods " + k.cfg.Selector
	case k.cfg.Service != "":
		return "endpointslices of service " + k.cfg.Service
	default:
		return "inferencepool " + k.cfg.InferencePool
	}
}

// onError makes the list and watch error handler of resource (an RBAC
// resource name, "pods"), replacing client-go's default handler (a log
// line on every retry): a refused list or watch is logged once, as the
// permission that is missing, until events flow again; the informer keeps
// retrying with its backoff meanwhile.
func (k *Source) onError(resource string) cache.WatchErrorHandlerWithContext {
	return func(_ context.Context, _ *cache.Reflector, err error) {
		k.pub.Failed()
		k.mu.Lock()
		first := !k.denied[resource]
		k.denied[resource] = true
		k.mu.Unlock()
		if !first {
			return
		}
		if apierrors.IsForbidden(err) {
			k.log.Error(fmt.Sprintf("%v: the router may not list and watch %s in namespace %q; grant get, list, watch on them (the chart's Role does)",
				ErrForbidden, resource, k.cfg.Namespace),
				zap.String("model", k.cfg.Model), zap.Error(err))
			return
		}
		k.log.Warn("discovery: list or watch failed; retrying", zap.String("model", k.cfg.Model), zap.String("resource", resource), zap.Error(err))
	}
}

// working forgets the refusals logged: events flow again, so the next
// refusal is news.
func (k *Source) working() {
	k.mu.Lock()
	n := len(k.denied)
	clear(k.denied)
	k.mu.Unlock()
	if n > 0 {
		k.log.Info("discovery: listing and watching work again", zap.String("model", k.cfg.Model))
	}
}

// Resource names in the words of an RBAC rule, for the error lines.
const (
	resourcePods           = "pods"
	resourceEndpointSlices = "endpointslices (API group discovery.k8s.io)"
	resourceInferencePools = "inferencepools (API group inference.networking.k8s.io)"
)

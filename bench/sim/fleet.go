package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/gpurouter/gpurouter/bench/tokens"
	"github.com/gpurouter/gpurouter/prefixcache"
)

// FleetConfig describes N replicas on loopback ports, one process. Only
// Replicas and Profiles are required.
type FleetConfig struct {
	Replicas int    // how many (≥ 1)
	Host     string // address to bind; "" = 127.0.0.1
	// BasePort is replica 0's port; replica i listens on BasePort+i.
	// 0 = ephemeral ports (for tests).
	BasePort int
	// Profiles holds one profile for every replica, or one per replica.
	Profiles []Profile
	// Speeds holds step-time divisors (see ReplicaConfig.Speed): none (all
	// 1), one for every replica, or one per replica.
	Speeds           []float64
	ServedModelNames []string // see ReplicaConfig.ServedModelNames
	LegacyMetrics    bool     // see ReplicaConfig.LegacyMetrics
	Faults           Faults   // initial faults of every replica
	Seed             uint64   // replica i gets Seed+i
	// Estimator is shared by the replicas; nil = tokens.New().
	Estimator *tokens.Estimator
	// SpinWait tunes the shared real-time loop (see ReplicaConfig.SpinWait).
	SpinWait time.Duration
	// KVEvents, when set, makes every replica publish its KV-cache events;
	// replica i's sockets listen on the given ports + i.
	KVEvents *KVEventsConfig
	// Tokenizer is shared by the replicas; nil = prefixcache.NewBPE("").
	Tokenizer *prefixcache.BPE
	// LoRAModules and AllowRuntimeLoRAUpdating apply to every replica
	// (see ReplicaConfig).
	LoRAModules              []LoRAModule
	AllowRuntimeLoRAUpdating bool
	// KVTransfer, when set, makes every replica a NixlConnector replica
	// (see ReplicaConfig.KVTransfer); replica i's side channel listens on
	// the given port + i.
	KVTransfer *KVTransferConfig
}

// Fleet is a set of replicas served on consecutive loopback ports, each with
// its own engine, scheduler loop, registry and /metrics.
type Fleet struct {
	replicas []*Replica
	host     string
	basePort int

	mu   sync.Mutex // guards lns
	lns  []net.Listener
	urls []string
}

// NewFleet builds the replicas. It starts nothing and binds nothing.
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	n := cfg.Replicas
	if n < 1 {
		return nil, fmt.Errorf("sim: fleet needs at least one replica, got %d", n)
	}
	pick := func(what string, have int) error {
		if have != 0 && have != 1 && have != n {
			return fmt.Errorf("sim: %d %s for %d replicas: give one, or one per replica", have, what, n)
		}
		return nil
	}
	if len(cfg.Profiles) == 0 {
		return nil, errors.New("sim: fleet needs a profile")
	}
	if err := errors.Join(pick("profiles", len(cfg.Profiles)), pick("speeds", len(cfg.Speeds))); err != nil {
		return nil, err
	}
	est := cfg.Estimator
	if est == nil {
		var err error
		if est, err = tokens.New(); err != nil {
			return nil, err
		}
	}
	bpe := cfg.Tokenizer
	if bpe == nil {
		var err error
		if bpe, err = prefixcache.NewBPE(""); err != nil {
			return nil, err
		}
	}
	f := &Fleet{host: cfg.Host, basePort: cfg.BasePort}
	if f.host == "" {
		f.host = "127.0.0.1"
	}
	for i := range n {
		rc := ReplicaConfig{
			Profile: cfg.Profiles[min(i, len(cfg.Profiles)-1)], ServedModelNames: cfg.ServedModelNames,
			Index: i, Estimator: est, LegacyMetrics: cfg.LegacyMetrics, Faults: cfg.Faults, Seed: cfg.Seed + uint64(i),
			SpinWait: cfg.SpinWait, Tokenizer: bpe,
			LoRAModules: cfg.LoRAModules, AllowRuntimeLoRAUpdating: cfg.AllowRuntimeLoRAUpdating,
		}
		if cfg.KVEvents != nil {
			kc, err := cfg.KVEvents.forReplica(i)
			if err != nil {
				return nil, fmt.Errorf("sim: replica %d: %w", i, err)
			}
			rc.KVEvents = &kc
		}
		if len(cfg.Speeds) > 0 {
			rc.Speed = cfg.Speeds[min(i, len(cfg.Speeds)-1)]
		}
		if cfg.KVTransfer != nil {
			kc := cfg.KVTransfer.forReplica(i, n)
			rc.KVTransfer = &kc
		}
		r, err := NewReplica(rc)
		if err != nil {
			return nil, fmt.Errorf("sim: replica %d: %w", i, err)
		}
		f.replicas = append(f.replicas, r)
	}
	return f, nil
}

// Listen binds every replica's port. On error nothing stays bound. Run
// calls it if it has not been called.
func (f *Fleet) Listen() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lns != nil {
		return nil
	}
	var lns []net.Listener
	var urls []string
	for i := range f.replicas {
		port := 0
		if f.basePort > 0 {
			port = f.basePort + i
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(f.host, strconv.Itoa(port)))
		if err != nil {
			for _, l := range lns {
				_ = l.Close()
			}
			return fmt.Errorf("sim: replica %d: %w", i, err)
		}
		lns = append(lns, ln)
		urls = append(urls, "http://"+ln.Addr().String())
	}
	for i, r := range f.replicas {
		if r.pub == nil {
			continue
		}
		if err := r.pub.Listen(); err != nil {
			for _, l := range lns {
				_ = l.Close()
			}
			return fmt.Errorf("sim: replica %d: KV events: %w", i, err)
		}
	}
	for i, r := range f.replicas {
		if err := r.ListenKVSideChannel(f.host); err != nil {
			for _, l := range lns {
				_ = l.Close()
			}
			for _, r := range f.replicas[:i] {
				r.closeKVSideChannel()
			}
			return fmt.Errorf("sim: replica %d: %w", i, err)
		}
	}
	f.lns, f.urls = lns, urls
	return nil
}

// URLs are the replicas' base URLs (http://127.0.0.1:PORT), after Listen.
func (f *Fleet) URLs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.urls...)
}

// Replicas are the fleet's replicas, for faults and inspection.
func (f *Fleet) Replicas() []*Replica { return append([]*Replica(nil), f.replicas...) }

// Run serves every replica (HTTP, and the engines, all driven in real time
// from one goroutine) until ctx is cancelled, then stops them all and
// returns when every goroutine it started has ended. It listens first if
// Listen has not been called. Run may be called once.
func (f *Fleet) Run(ctx context.Context) error {
	if err := f.Listen(); err != nil {
		return err
	}
	f.mu.Lock()
	lns := f.lns
	f.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(f.replicas)+1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs[len(f.replicas)] = runReplicas(ctx, f.replicas)
	}()
	for i, r := range f.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.Serve(ctx, lns[i])
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

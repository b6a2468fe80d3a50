package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/proxy"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// LoRA is how a pool serves LoRA adapters of its model. The zero value
// declares none, learns them from the replicas (their /v1/models every
// DefaultModelsInterval, their metrics at every scrape) and places
// requests for them knowing which replica holds which.
type LoRA struct {
	balancer.LoRAConfig
	// ModelsInterval is how often each replica's /v1/models is read for
	// the adapters it serves (entries with a parent); 0 means
	// DefaultModelsInterval, negative never.
	ModelsInterval time.Duration
}

// DefaultModelsInterval is how often a replica's /v1/models is read when
// LoRA.ModelsInterval is 0: adapters loaded at run time are routed within
// this long (at once when a request for one shows in the metrics).
const DefaultModelsInterval = 10 * time.Second

// errModels is a /v1/models answer the watch could not read.
var errModels = errors.New("fleet: unreadable /v1/models")

// modelsWatch reads the replicas' /v1/models for the LoRA adapters each
// serves: the replica learns which (balancer.Replica.SetAdapters) and its
// pool routes them (balancer.Pool.LearnAdapters). A read replaces what the
// router loaded there on demand (proxy/lora_load.go): the engine's list is
// the truth, so an adapter it lost is loaded again. A replica that does
// not answer keeps what it said last. Build with newModelsWatch; Run reads.
type modelsWatch struct {
	client  *fasthttp.Client
	targets []modelsTarget
	log     *zap.Logger
}

type modelsTarget struct {
	pool  *balancer.Pool
	rep   *balancer.Replica
	url   string
	every time.Duration
}

// newModelsWatch is the watch over spec's pools whose adapters are read
// from their replicas; nil when none is.
func newModelsWatch(spec Spec, routes []proxy.Route, replicas [][]*balancer.Replica, client *fasthttp.Client, log *zap.Logger) *modelsWatch {
	w := &modelsWatch{client: client, log: log}
	for i, pc := range spec.Pools {
		every := pc.LoRA.ModelsInterval
		if every == 0 {
			every = DefaultModelsInterval
		}
		if every < 0 || spec.Telemetry == nil || (pc.Engine != gpu.EngineAuto && pc.Engine != gpu.EngineVLLM) {
			continue
		}
		for _, r := range replicas[i] {
			w.targets = append(w.targets, modelsTarget{pool: routes[i].Pool, rep: r, url: r.URL() + "/v1/models", every: every})
		}
	}
	if len(w.targets) == 0 {
		return nil
	}
	return w
}

// Run reads every target at once, then each at its interval, until ctx
// ends.
func (w *modelsWatch) Run(ctx context.Context) error {
	next := make([]time.Time, len(w.targets))
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := time.Now()
		soonest := now.Add(time.Hour)
		for i, tg := range w.targets {
			if !now.Before(next[i]) {
				if err := w.read(tg, now.Add(min(tg.every, 5*time.Second))); err != nil {
					w.log.Debug("lora: reading a replica's adapters", zap.String("replica", tg.rep.Name()), zap.Error(err))
				}
				next[i] = now.Add(tg.every)
			}
			if next[i].Before(soonest) {
				soonest = next[i]
			}
		}
		t.Reset(time.Until(soonest))
	}
}

// read asks one replica for its models.
func (w *modelsWatch) read(tg modelsTarget, deadline time.Time) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(tg.url)
	if err := w.client.DoDeadline(req, resp, deadline); err != nil {
		return err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return fmt.Errorf("%w: status %d", errModels, resp.StatusCode())
	}
	names, err := adaptersOf(resp.Body())
	if err != nil {
		return err
	}
	tg.rep.SetAdapters(names)
	tg.pool.LearnAdapters(names)
	return nil
}

// adaptersOf reads the LoRA adapters of a /v1/models document: its
// entries with a parent (vLLM lists an adapter with its base model as
// parent, a served model with none).
func adaptersOf(body []byte) ([]string, error) {
	var doc struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("%w: %v", errModels, err)
	}
	names := []string{}
	for _, m := range doc.Data {
		if m.Parent != nil && *m.Parent != "" && m.ID != "" {
			names = append(names, m.ID)
		}
	}
	return names, nil
}

package gpu

import (
	"context"
	"encoding/json"
	"fmt"
)

// AgentSource is the Source of GPUs on another host, read from the
// `gpurouter agent` beside the replica (or anything serving a HostReport at
// GET /v1/gpus, such as the simulator). Build with NewAgentSource; the zero
// value is unusable. Safe for concurrent use.
type AgentSource struct {
	url    string
	client HTTPDoer
	sel    Selector
}

// NewAgentSource reads the GPUs sel selects (usually the replica's UUIDs) from
// the agent at agentURL: its base URL (http://10.0.0.5:9401, /v1/gpus is
// appended) or the full report URL. client nil means a fasthttp.HostClient
// of its own for that host.
func NewAgentSource(agentURL string, sel Selector, client HTTPDoer) (*AgentSource, error) {
	u, err := scrapeURL(agentURL, "/v1/gpus")
	if err != nil {
		return nil, err
	}
	if client == nil {
		client = newHostClient(u)
	}
	return &AgentSource{url: u.String(), client: client, sel: sel}, nil
}

// Fetch gets the agent's HostReport before ctx's deadline and returns the
// selected GPUs. An agent whose host has telemetry off reports no GPUs: with
// a non-empty Selector that is ErrGPUNotFound (the binding cannot be served).
func (s *AgentSource) Fetch(ctx context.Context) ([]GPUStats, error) {
	var rep HostReport
	err := get(ctx, s.client, s.url, "application/json", func(body []byte) error {
		if err := json.Unmarshal(body, &rep); err != nil {
			return fmt.Errorf("%w: agent report: %v", ErrMalformed, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.sel.pick(rep.GPUs)
}

package gpu

import (
	"context"
	"sync"
)

// acceptText asks for Prometheus text format 0.0.4, the format the parsers read.
const acceptText = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

// EngineScraper is the EngineSource of one vLLM replica: GET /metrics over
// fasthttp, parse the families the router needs. Build with
// NewEngineScraper; the zero value is unusable. Safe for concurrent use
// (parsing is serialised; the poller makes one call at a time anyway).
type EngineScraper struct {
	url    string
	client HTTPDoer

	mu     sync.Mutex // guards parser, whose buffer is reused across scrapes
	parser *engineParser
}

// NewEngineScraper returns a scraper of the vLLM replica at replicaURL: its
// base URL (http://10.0.0.5:8000, /metrics is appended) or the full metrics
// URL. client nil means a fasthttp.HostClient of its own for that host.
func NewEngineScraper(replicaURL string, client HTTPDoer) (*EngineScraper, error) {
	u, err := scrapeURL(replicaURL, "/metrics")
	if err != nil {
		return nil, err
	}
	if client == nil {
		client = newHostClient(u)
	}
	return &EngineScraper{url: u.String(), client: client, parser: newEngineParser()}, nil
}

// URL is the metrics URL the scraper reads.
func (e *EngineScraper) URL() string { return e.url }

// Fetch scrapes and parses the replica's /metrics once, before ctx's deadline.
func (e *EngineScraper) Fetch(ctx context.Context) (*EngineStats, error) {
	var s *EngineStats
	err := get(ctx, e.client, e.url, acceptText, func(body []byte) error {
		e.mu.Lock()
		defer e.mu.Unlock()
		var err error
		s, err = e.parser.parse(body)
		return err
	})
	return s, err
}

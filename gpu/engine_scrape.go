package gpu

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/valyala/fasthttp"
)

// acceptText asks for Prometheus text format 0.0.4, the format the parsers read.
const acceptText = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

// EngineScraper is the EngineSource of one replica: GET /metrics over
// fasthttp, parse the families the router needs of a vLLM, SGLang,
// llama.cpp or TGI engine, named in advance or detected. Build with
// NewEngineScraper, NewEngineScraperFor or NewEngineSource; the zero value
// is unusable. Safe for concurrent use (parsing is serialised; the poller
// makes one call at a time anyway).
type EngineScraper struct {
	url    string
	client HTTPDoer
	engine Engine // as configured; EngineAuto detects

	mu       sync.Mutex // guards parser, whose buffers are reused across scrapes, and detected
	parser   *engineParser
	detected Engine // engine of the last successful parse; EngineAuto until one
}

// NewEngineScraper returns a scraper that detects the engine of the
// replica at replicaURL in every scrape: NewEngineScraperFor with
// EngineAuto.
func NewEngineScraper(replicaURL string, client HTTPDoer) (*EngineScraper, error) {
	return NewEngineScraperFor(replicaURL, EngineAuto, client)
}

// NewEngineScraperFor returns a scraper of the replica at replicaURL that
// reads engine's metric families only (EngineAuto: the engine detected in
// each scrape). replicaURL is the replica's base URL (http://10.0.0.5:8000,
// /metrics is appended) or its full metrics URL, query included (llama.cpp
// in router mode wants ?model=…). client nil means a fasthttp.HostClient of
// its own for that host. EngineNone has no scraper: use NewEngineSource,
// which returns none for it.
func NewEngineScraperFor(replicaURL string, engine Engine, client HTTPDoer) (*EngineScraper, error) {
	if engine == EngineNone {
		return nil, errors.New("gpu: engine none is not scraped (NewEngineSource returns no source for it)")
	}
	if _, err := ParseEngine(string(engine)); err != nil {
		return nil, err
	}
	u, err := scrapeURL(replicaURL, "/metrics")
	if err != nil {
		return nil, err
	}
	if client == nil {
		client = newHostClient(u)
	}
	return &EngineScraper{url: u.String(), client: client, engine: engine, parser: newEngineParser(engine)}, nil
}

// NewEngineSource is what a replica's configured engine becomes on a
// Target: nil (and no error) for EngineNone, so that the poller never
// scrapes it and the router routes it on its own counts; otherwise the
// scraper of NewEngineScraperFor. The nil is a nil interface, safe to store
// in Target.Engine as is.
func NewEngineSource(replicaURL string, engine Engine, client HTTPDoer) (EngineSource, error) {
	if engine == EngineNone {
		return nil, nil
	}
	s, err := NewEngineScraperFor(replicaURL, engine, client)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// URL is the metrics URL the scraper reads.
func (e *EngineScraper) URL() string { return e.url }

// Engine is the engine the scraper was built for; EngineAuto when it
// detects.
func (e *EngineScraper) Engine() Engine { return e.engine }

// Detected is the engine whose metrics the last successful scrape read
// (also in that scrape's EngineStats.Engine); EngineAuto until a scrape
// succeeds.
func (e *EngineScraper) Detected() Engine {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.detected
}

// Fetch scrapes and parses the replica's /metrics once, before ctx's
// deadline. A body with no metrics of the engine (or of any known engine),
// and a 404 or 501 (SGLang without --enable-metrics, llama-server without
// --metrics), are ErrNoEngineMetrics: the replica answers but exposes
// nothing the router reads.
func (e *EngineScraper) Fetch(ctx context.Context) (*EngineStats, error) {
	var s *EngineStats
	err := get(ctx, e.client, e.url, acceptText, func(body []byte) error {
		e.mu.Lock()
		defer e.mu.Unlock()
		var err error
		s, err = e.parser.parse(body)
		if err == nil {
			e.detected = s.Engine
		}
		return err
	})
	if se := (*statusError)(nil); errors.As(err, &se) &&
		(se.code == fasthttp.StatusNotFound || se.code == fasthttp.StatusNotImplemented) {
		return nil, fmt.Errorf("%w (%w)", ErrNoEngineMetrics, err)
	}
	return s, err
}

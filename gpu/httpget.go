package gpu

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/valyala/fasthttp"
)

// HTTPDoer is the part of a fasthttp client the scrapers use;
// *fasthttp.HostClient and *fasthttp.Client implement it. Scrapes honour
// their context's deadline through it (fasthttp takes no context).
type HTTPDoer interface {
	DoDeadline(req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error
}

// Defaults of the scrapers' own HTTP clients.
const (
	// DefaultScrapeDeadline bounds a scrape whose context has no deadline.
	DefaultScrapeDeadline = 5 * time.Second
	// maxScrapeBody caps a scraped body; a vLLM /metrics is ~50 KB per engine.
	maxScrapeBody = 16 << 20
)

// scrapeURL parses rawURL as http(s)://host[:port][/path]; a URL with no path
// (or "/") gets defaultPath.
func scrapeURL(rawURL, defaultPath string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("gpu: scrape URL: %w", err)
	}
	if u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("gpu: scrape URL must be http(s)://host[:port][/path], got %q", rawURL)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = defaultPath
	}
	return u, nil
}

// newHostClient is the HTTP client of one scrape target: one host, at most
// two connections (the poller makes one scrape at a time; the second serves
// PollOnce beside Run), no retries (the next tick is the retry). Deadlines
// come per request from DoDeadline, which bounds dial, write and read.
func newHostClient(u *url.URL) *fasthttp.HostClient {
	addr := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			addr += ":443"
		} else {
			addr += ":80"
		}
	}
	return &fasthttp.HostClient{
		Addr:                      addr,
		IsTLS:                     u.Scheme == "https",
		MaxConns:                  2,
		MaxResponseBodySize:       maxScrapeBody,
		NoDefaultUserAgentHeader:  true,
		MaxIdemponentCallAttempts: 1,
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		MaxIdleConnDuration:       time.Minute,
	}
}

// get does GET url with client before ctx's deadline and hands the body of a
// 200 response to use, which must not keep it.
func get(ctx context.Context, client HTTPDoer, url, accept string, use func(body []byte) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultScrapeDeadline)
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.Set(fasthttp.HeaderAccept, accept)
	if err := client.DoDeadline(req, resp, deadline); err != nil {
		if errors.Is(err, fasthttp.ErrTimeout) {
			return fmt.Errorf("GET %s: %w (%v)", url, context.DeadlineExceeded, err)
		}
		return fmt.Errorf("GET %s: %w", url, err)
	}
	if sc := resp.StatusCode(); sc != fasthttp.StatusOK {
		return &statusError{url: url, code: sc}
	}
	return use(resp.Body())
}

// statusError is a response other than 200: ErrHTTPStatus with the URL and
// the code, which a caller may read (errors.As) to tell "no such endpoint"
// from a failing one.
type statusError struct {
	url  string
	code int
}

func (e *statusError) Error() string {
	return fmt.Sprintf("GET %s: %v %d", e.url, ErrHTTPStatus, e.code)
}
func (e *statusError) Unwrap() error { return ErrHTTPStatus }

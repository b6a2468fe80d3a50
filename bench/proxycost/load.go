package proxycost

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// chatRequest is an OpenAI chat request of n bytes (or of its fields
// alone, when n is smaller), its one message padded with words; stream
// asks for a stream.
func chatRequest(n int, stream bool) []byte {
	head := `{"model":"m","messages":[{"role":"user","content":"`
	tail := `"}],"max_tokens":64,"temperature":0}`
	if stream {
		tail = `"}],"max_tokens":64,"stream":true}`
	}
	return []byte(head + pad(n-len(head)-len(tail)) + tail)
}

// closedLoop is c clients, each sending the next request as soon as the
// last one's answer is read, until d has passed.
type loopResult struct {
	requests int
	errors   int
	lat      []time.Duration // every request's latency
	elapsed  time.Duration
}

func closedLoop(ctx context.Context, addr string, body []byte, c int, d time.Duration) loopResult {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: c, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	var mu sync.Mutex
	var res loopResult
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + addr + "/v1/chat/completions")
			req.Header.SetMethod(fasthttp.MethodPost)
			req.Header.SetContentType("application/json")
			req.SetBodyRaw(body)
			lat := make([]time.Duration, 0, 4096)
			errs := 0
			for ctx.Err() == nil {
				t0 := time.Now()
				if t0.After(end) {
					break
				}
				err := hc.Do(req, resp)
				if err != nil || resp.StatusCode() != 200 || !bytes.HasSuffix(resp.Body(), replyEnd) {
					errs++
					if errs > 100 {
						break // the target is broken: don't spin on it
					}
					continue
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			res.lat = append(res.lat, lat...)
			res.errors += errs
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	res.requests = len(res.lat)
	return res
}

// streamClient is the HTTP client of the stream workloads: one
// connection per stream, kept alive across streams.
func streamClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		DisableCompression:  true,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}}
}

func newStreamRequest(ctx context.Context, addr string, body []byte, mode string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(modeHeader, mode)
	return req, nil
}

// sseResult is what the SSE clients saw: every event's delay from the
// upstream's send stamp, and every gap between two events of a stream.
type sseResult struct {
	events    int
	streams   int
	errors    int
	delay     []time.Duration
	gaps      []time.Duration
	coalesced int // gaps under a fifth of the interval: events that arrived together
	elapsed   time.Duration
}

// sseLoop is c clients, each reading one stream to its [DONE] and starting
// the next, until d has passed.
func sseLoop(ctx context.Context, addr string, body []byte, c int, d, interval time.Duration) sseResult {
	hc := streamClient(c)
	defer hc.CloseIdleConnections()
	var mu sync.Mutex
	var res sseResult
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			var one sseResult
			for ctx.Err() == nil && time.Now().Before(end) {
				if err := readStream(ctx, hc, addr, body, interval, &one); err != nil {
					one.errors++
					if one.errors > 20 {
						break
					}
					continue
				}
				one.streams++
			}
			mu.Lock()
			res.events += one.events
			res.streams += one.streams
			res.errors += one.errors
			res.coalesced += one.coalesced
			res.delay = append(res.delay, one.delay...)
			res.gaps = append(res.gaps, one.gaps...)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

var errNoDone = errors.New("proxycost: stream ended without [DONE]")

// readStream reads one stream, timing each event as its line arrives.
func readStream(ctx context.Context, hc *http.Client, addr string, body []byte, interval time.Duration, res *sseResult) error {
	req, err := newStreamRequest(ctx, addr, body, modeSSE)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		return fmt.Errorf("proxycost: status %d", resp.StatusCode)
	}
	br := bufio.NewReaderSize(resp.Body, 4096)
	var last time.Time
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return errors.Join(errNoDone, err)
		}
		now := time.Now()
		if sent, ok := eventStamp(line); ok {
			res.events++
			res.delay = append(res.delay, time.Duration(now.UnixNano()-sent))
			if !last.IsZero() {
				gap := now.Sub(last)
				res.gaps = append(res.gaps, gap)
				if gap < interval/5 {
					res.coalesced++
				}
			}
			last = now
			continue
		}
		if bytes.HasPrefix(line, []byte("data: [DONE]")) {
			io.Copy(io.Discard, br) //nolint:errcheck
			return nil
		}
	}
}

// idleStreams opens n streams that each get their first event and then
// wait; ready is called once all have it (or failed), and the streams are
// read to their end after release.
type idleResult struct {
	opened int
	errors int
}

func idleStreams(ctx context.Context, addr string, body []byte, n int, ready func()) idleResult {
	hc := streamClient(n)
	defer hc.CloseIdleConnections()
	var opened, failed sync.WaitGroup
	var mu sync.Mutex
	var res idleResult
	bodies := make([]io.ReadCloser, 0, n)
	sem := make(chan struct{}, 64) // open at most 64 at a time
	for range n {
		opened.Add(1)
		failed.Go(func() {
			sem <- struct{}{}
			rc, err := openIdle(ctx, hc, addr, body)
			<-sem
			mu.Lock()
			if err != nil {
				res.errors++
			} else {
				res.opened++
				bodies = append(bodies, rc)
			}
			mu.Unlock()
			opened.Done()
		})
	}
	opened.Wait()
	failed.Wait()
	ready()
	var wg sync.WaitGroup
	for _, b := range bodies {
		wg.Go(func() {
			io.Copy(io.Discard, b) //nolint:errcheck
			b.Close()
		})
	}
	wg.Wait()
	return res
}

// openIdle starts an idle stream and reads its first event.
func openIdle(ctx context.Context, hc *http.Client, addr string, body []byte) (io.ReadCloser, error) {
	req, err := newStreamRequest(ctx, addr, body, modeIdle)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("proxycost: status %d", resp.StatusCode)
	}
	br := bufio.NewReaderSize(resp.Body, 512)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			resp.Body.Close()
			return nil, err
		}
		if _, ok := eventStamp(line); ok {
			return readCloser{br, resp.Body}, nil
		}
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}

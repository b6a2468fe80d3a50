package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// kvParams reads a request's kv_transfer_params as NixlConnector does: a
// prefill request (do_remote_decode) gets its blocks held at the end; a
// decode request (do_remote_prefill) whose params name everything a read
// needs, and the prompt's blocks, has its KV read instead of computed. A
// decode request without them is computed here, as vLLM does after
// warning "Got invalid KVTransferParams". A replica without a connector
// ignores them (nil), as vLLM's scheduler does. The error is for a value
// that is no kv_transfer_params object.
func (r *Replica) kvParams(raw json.RawMessage, prompt int) (*seqKV, error) {
	if r.eng.kvx == nil || len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var p kvTransferParamsIn
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("kv_transfer_params: %w", err)
	}
	switch {
	case p.DoRemotePrefill:
		if !p.remote() || len(p.RemoteBlockIDs) != ceilDiv(prompt, r.d.blockSize) {
			r.m.kv.read(pullInvalidParams, 0, 0, 0, 0)
			return nil, nil
		}
		return &seqKV{load: &kvLoad{engineID: *p.RemoteEngineID, requestID: *p.RemoteRequestID, host: *p.RemoteHost,
			port: *p.RemotePort, remote: p.RemoteBlockIDs}}, nil
	case p.DoRemoteDecode:
		return &seqKV{produce: true}, nil
	}
	return nil, nil
}

// kvRequestID is the remote_request_id of a held request: the response's
// id and a random suffix, as vLLM makes internal request ids unique
// (which is why NIXL_CONNECTOR_VERSION 2 added remote_request_id: the
// router's X-Request-Id may repeat).
func kvRequestID(responseID string, salt uint64) string {
	return fmt.Sprintf("%s-%08x", responseID, uint32(salt>>32))
}

// startPulls carries out the reads the engine decided, each on a
// goroutine of its own that ends by ctx at the latest.
func (r *Replica) startPulls(ctx context.Context, ss []*seq) {
	for _, s := range ss {
		ld := *s.kv.load // fixed at admission: the goroutine's copy
		r.pulls.Add(1)
		go func() {
			defer r.pulls.Done()
			r.pull(ctx, s, ld)
		}()
	}
}

// pull reads s's KV from the prefill replica and reports to the engine.
// A read cut short by the replica's own shutdown counts for nothing.
func (r *Replica) pull(ctx context.Context, s *seq, ld kvLoad) {
	start := time.Now()
	outcome, post, res := r.doPull(ctx, ld)
	if ctx.Err() != nil && outcome != pullOK {
		return
	}
	layers := max(r.cfg.Profile.Model.NumLayers, 1)
	r.m.kv.read(outcome, post, time.Since(start), res.Bytes, len(ld.pull)*layers*2)
	r.mu.Lock()
	r.eng.loadDone(s, outcome == pullOK, time.Now())
	r.mu.Unlock()
	r.kick()
}

// doPull is one read over the side channel: the headers say it is posted
// (post time), the body that it is done.
func (r *Replica) doPull(ctx context.Context, ld kvLoad) (outcome string, post time.Duration, res kvPullResult) {
	ctx, cancel := context.WithTimeout(ctx, r.kvc.PullTimeout)
	defer cancel()
	body, _ := json.Marshal(kvPullRequest{EngineID: ld.engineID, RequestID: ld.requestID, BlockIDs: ld.pull,
		Reader: r.kvc.EngineID, BandwidthGBps: r.kvc.BandwidthGBps})
	url := "http://" + net.JoinHostPort(ld.host, strconv.Itoa(ld.port)) + kvPullPath
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return pullConnect, 0, res
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := r.kvClient.Do(req)
	if err != nil {
		return pullFailure(ctx, pullConnect), 0, res
	}
	defer resp.Body.Close()
	post = time.Since(start)
	data, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return pullFailure(ctx, pullReset), post, res
	case resp.StatusCode != http.StatusOK:
		return pullRefused, post, res
	case json.Unmarshal(data, &res) != nil:
		return pullReset, post, res
	}
	return pullOK, post, res
}

// pullFailure names a read's failure: a timeout if the pull timeout
// passed, else what failed.
func pullFailure(ctx context.Context, what string) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return pullTimeout
	}
	return what
}

// newKVClient is the decode side's HTTP client: a connection per read, so
// that a prefill replica that died and came back is met afresh.
func newKVClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, MaxConnsPerHost: 0}}
}

// kvLoadFailedMessage is the error of a decode request whose read failed
// under kv_load_failure_policy "fail".
const kvLoadFailedMessage = "KV cache load from the prefill replica failed (kv_load_failure_policy=fail)"

// kvTransferParams is a non-streaming response's kv_transfer_params: the
// held blocks of a prefill request, null otherwise (vLLM's response
// models always carry the field); left out by a replica without a
// connector, whose responses stay as they were.
func (q *request) kvTransferParams() json.RawMessage {
	if q.r.eng.kvx == nil {
		return nil
	}
	if q.s.kv == nil || q.s.kv.out == nil {
		return json.RawMessage("null")
	}
	b, _ := json.Marshal(q.s.kv.out)
	return b
}

// appendErrorEvent appends an SSE event carrying vLLM's error document.
func appendErrorEvent(b []byte, msg string) []byte {
	doc, _ := json.Marshal(apiErrorBody{Error: apiErrorInfo{Message: msg, Type: "InternalServerError", Code: http.StatusInternalServerError}})
	b = append(b, "data: "...)
	b = append(b, doc...)
	return append(b, "\n\n"...)
}

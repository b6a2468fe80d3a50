package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// kvPullPath is the side channel's one endpoint.
const kvPullPath = "/sim/kv_transfer/pull"

// kvPullRequest is a decode replica's read of a held request's blocks.
type kvPullRequest struct {
	// EngineID is the engine the reader expects (the remote_engine_id it
	// was given): a replica that is not it refuses, as NIXL's handshake
	// does.
	EngineID  string `json:"engine_id"`
	RequestID string `json:"remote_request_id"`
	BlockIDs  []int  `json:"block_ids"`
	// Reader is the reading replica's engine id (for logs and errors).
	Reader string `json:"reader_engine_id"`
	// BandwidthGBps is the reader's bandwidth: the read goes at the
	// slower end's.
	BandwidthGBps float64 `json:"bandwidth_gbps"`
}

// kvPullResult is the read's answer, written when the transfer is over.
type kvPullResult struct {
	Blocks  int     `json:"blocks"`
	Bytes   float64 `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

// errKVTransferDied ends a read whose replica the kv_transfer_crash fault
// killed half-way.
var errKVTransferDied = errors.New("sim: replica died mid-transfer (kv_transfer_crash fault)")

// setupKVTransfer gives the replica a NixlConnector: the engine's half and
// the pull client. The side channel is bound by ListenKVSideChannel.
func (r *Replica) setupKVTransfer(c KVTransferConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	c = c.withDefaults()
	if c.EngineID == "" {
		c.EngineID = engineIDFor(r.cfg.Seed, r.cfg.Index, c)
	}
	r.kvc = c
	r.eng.kvx = newKVEngine(c, r.d.tp, r.m.kv)
	return nil
}

// KVTransfer is the replica's effective KV connector configuration
// (defaults filled, engine id drawn); false without one.
func (r *Replica) KVTransfer() (KVTransferConfig, bool) { return r.kvc, r.eng.kvx != nil }

// ListenKVSideChannel binds the side channel (at the configured host, else
// bindHost, and port) if the replica has a connector and it is not bound
// yet. Fleet.Listen and Serve call it.
func (r *Replica) ListenKVSideChannel(bindHost string) error {
	if r.eng.kvx == nil || r.kvAddr.Load() != nil {
		return nil
	}
	host := r.kvc.SideChannelHost
	if host == "" {
		host = bindHost
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(r.kvc.SideChannelPort)))
	if err != nil {
		return fmt.Errorf("KV transfer side channel: %w", err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	adv := r.kvc.SideChannelHost
	if adv == "" {
		adv = addr.IP.String()
	}
	r.mu.Lock()
	r.eng.kvx.host, r.eng.kvx.port = adv, addr.Port
	r.mu.Unlock()
	r.kvLn = ln
	s := ln.Addr().String()
	r.kvAddr.Store(&s)
	return nil
}

// closeKVSideChannel unbinds a side channel nothing serves yet (a fleet
// whose Listen failed).
func (r *Replica) closeKVSideChannel() {
	if r.kvLn != nil {
		_ = r.kvLn.Close()
		r.kvLn = nil
		r.kvAddr.Store(nil)
	}
}

// KVSideChannelAddr is where the side channel listens ("" when the
// replica has none or it is not bound).
func (r *Replica) KVSideChannelAddr() string {
	if p := r.kvAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// sideServer is the incarnation's side channel server; it shares the
// incarnation's connections, so a crash resets a read in flight.
func (inc *incarnation) sideServer() *fasthttp.Server {
	srv := inc.server()
	srv.Handler = inc.handleSide
	return srv
}

// handleSide serves POST /sim/kv_transfer/pull: headers at once (the read
// is posted), the result when the transfer time is over.
func (inc *incarnation) handleSide(ctx *fasthttp.RequestCtx) {
	r := inc.r
	ctx.Response.Header.DisableNormalizing()
	if r.isDown(time.Now()) {
		dropConn(ctx)
		return
	}
	if string(ctx.Path()) != kvPullPath {
		writeJSON(ctx, fasthttp.StatusNotFound, map[string]string{"detail": "Not Found"})
		return
	}
	if !ctx.IsPost() {
		writeMethodNotAllowed(ctx)
		return
	}
	var req kvPullRequest
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeBadRequest(ctx, "invalid JSON body: "+err.Error())
		return
	}
	f := r.faults.Load()
	r.mu.Lock()
	fail := f.KVTransferFailRate > 0 && r.rng.Float64() < f.KVTransferFailRate
	var err error
	if !fail {
		err = r.eng.beginSend(req.RequestID, req.EngineID, req.BlockIDs)
	}
	r.mu.Unlock()
	switch {
	case fail:
		writeError(ctx, fasthttp.StatusInternalServerError, "InternalServerError",
			"NIXL transfer failed (kv_transfer_fail_rate fault)")
		return
	case errors.Is(err, errKVNotHeld):
		writeError(ctx, fasthttp.StatusNotFound, "NotFoundError", err.Error())
		return
	case err != nil:
		writeBadRequest(ctx, err.Error())
		return
	}
	bytes := float64(len(req.BlockIDs)*r.d.blockSize) * r.d.kvBytesPerToken
	bw := r.kvc.BandwidthGBps
	if req.BandwidthGBps > 0 {
		bw = min(bw, req.BandwidthGBps)
	}
	ctx.SetContentType("application/json")
	ctx.Response.ImmediateHeaderFlush = true
	ctx.SetBodyStream(&pullBody{inc: inc, conn: ctx.Conn(), id: req.RequestID, blocks: len(req.BlockIDs), bytes: bytes,
		dur: time.Duration(bytes / (bw * 1e9) * 1e9)}, -1)
}

// pullBody is a read's response body: nothing until the transfer time has
// passed, then the result. It fails (fasthttp then drops the connection
// mid-response) when the replica stops or crashes, when the reader has
// gone, or under the kv_transfer_* faults.
type pullBody struct {
	inc    *incarnation
	conn   net.Conn
	id     string
	blocks int
	bytes  float64
	dur    time.Duration

	res   []byte
	off   int
	ended bool // endSend called
}

func (b *pullBody) Read(p []byte) (int, error) {
	if b.res == nil {
		if err := b.transfer(); err != nil {
			return 0, err
		}
	}
	if b.off >= len(b.res) {
		return 0, io.EOF
	}
	n := copy(p, b.res[b.off:])
	b.off += n
	return n, nil
}

// transfer waits out the transfer, then frees the blocks and prepares the
// result.
func (b *pullBody) transfer() error {
	r := b.inc.r
	f := r.faults.Load()
	wait := b.dur
	if f.KVTransferCrashSeconds > 0 {
		wait /= 2
	}
	var fire <-chan time.Time
	if !f.KVTransferStall {
		t := time.NewTimer(wait)
		defer t.Stop()
		fire = t.C
	}
	tick := time.NewTicker(housekeepingInterval)
	defer tick.Stop()
wait:
	for {
		select {
		case <-fire: // never, when stalled
			if f.KVTransferCrashSeconds > 0 {
				r.Crash(secondsDur(f.KVTransferCrashSeconds))
				return errKVTransferDied
			}
			break wait
		case <-b.inc.quit:
			return errShutdown
		case <-r.stopped:
			return errShutdown
		case <-tick.C:
			if peerClosed(b.conn) {
				return errAborted
			}
		}
	}
	r.mu.Lock()
	held := r.eng.endSend(b.id, true)
	r.mu.Unlock()
	b.ended = true
	if !held {
		return errAborted // dropped meanwhile (a crash)
	}
	r.m.kv.bytesOut.Add(b.bytes)
	b.res, _ = json.Marshal(kvPullResult{Blocks: b.blocks, Bytes: b.bytes, Seconds: b.dur.Seconds()})
	return nil
}

// CloseWithError ends a read that did not deliver: the blocks stay held.
func (b *pullBody) CloseWithError(error) error {
	if !b.ended {
		b.ended = true
		r := b.inc.r
		r.mu.Lock()
		r.eng.endSend(b.id, false)
		r.mu.Unlock()
	}
	return nil
}

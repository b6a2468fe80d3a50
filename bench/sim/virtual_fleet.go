package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FleetShape is the fleet SimulateFleet runs a workload against: Replicas
// colocated replicas, or a prefill/decode split of Prefill and Decode
// replicas that hand each request's KV over at BandwidthGBps.
type FleetShape struct {
	Replicas        int     // colocated replicas (when Prefill and Decode are 0); 0 = 1
	Prefill, Decode int     // a split: both ≥ 1
	BandwidthGBps   float64 // KV transfer bandwidth of a split; 0 = DefaultKVTransferBandwidthGBps
}

// Split reports whether the shape is a prefill/decode split.
func (f FleetShape) Split() bool { return f.Prefill > 0 || f.Decode > 0 }

// SimulateFleet is Simulate over a fleet, in virtual time: the same
// engines, one per replica, behind a router that sends each request to
// the replica with the fewest requests it has sent there and not seen
// finish (least outstanding requests; in a split, a prefill replica by
// its prefills, then a decode replica). A split runs each request as the
// router will drive stock vLLM: a prefill of max_tokens 1 holding its
// blocks, then the request on a decode replica that reads them (whole
// blocks × block_size × the profile's KV bytes per token over the
// bandwidth) and computes only the last prompt token. Every replica's
// frontend costs the profile's API overheads, the decode replica's too.
// It is deterministic for a given seed. Report's KVTransfers and
// KVTransferTime describe the reads.
func SimulateFleet(p Profile, w Workload, shape FleetShape) (Report, error) {
	if !shape.Split() && shape.Replicas <= 1 {
		return Simulate(p, w)
	}
	if shape.Split() && (shape.Prefill < 1 || shape.Decode < 1) {
		return Report{}, errors.New("sim: a split fleet needs at least one prefill and one decode replica")
	}
	if shape.Replicas < 0 || shape.BandwidthGBps < 0 || w.NumPrompts <= 0 || len(w.Classes) == 0 {
		return Report{}, errors.New("sim: fleet shape and workload must be positive")
	}
	if w.Adapters > 0 {
		return Report{}, errors.New("sim: fleet predictions do not model LoRA adapters")
	}
	d, err := p.derive()
	if err != nil {
		return Report{}, err
	}
	fd := &fleetDriver{v: &vdriver{p: p, w: w, rng: rand.New(rand.NewPCG(w.Seed, 0x5EED))}, p: p, d: d,
		bandwidth: shape.BandwidthGBps}
	if fd.bandwidth == 0 {
		fd.bandwidth = DefaultKVTransferBandwidthGBps
	}
	n := max(shape.Replicas, 1)
	if shape.Split() {
		n = shape.Prefill + shape.Decode
	}
	for i := range n {
		m := newEngineMetrics(prometheus.NewRegistry(), metricsOptions{modelName: p.Model.Name, maxModelLen: d.maxModelLen,
			kvTransfer: shape.Split()})
		eng, err := newEngine(p, m)
		if err != nil {
			return Report{}, err
		}
		ve := &vengine{eng: eng, index: i}
		if shape.Split() {
			c := KVTransferConfig{Role: KVConsumer, EngineID: fmt.Sprintf("engine-%d", i)}
			if i < shape.Prefill {
				c.Role = KVProducer
			}
			eng.kvx = newKVEngine(c.withDefaults(), d.tp, m.kv)
			if i < shape.Prefill {
				fd.prefill = append(fd.prefill, ve)
			} else {
				fd.decode = append(fd.decode, ve)
			}
		} else {
			fd.decode = append(fd.decode, ve)
		}
		fd.all = append(fd.all, ve)
	}
	fd.v.eng = fd.all[0].eng // report() reads only what is summed over engines below
	if err := fd.v.makeRequests(d.maxModelLen); err != nil {
		return Report{}, err
	}
	fd.run()
	rep := fd.v.report()
	rep.Preemptions = 0
	var hits, queries int
	for _, e := range fd.all {
		rep.Preemptions += e.eng.preemptions
		hits, queries = hits+e.eng.prefixHits, queries+e.eng.prefixQueries
	}
	rep.PrefixCacheHitRate = 0
	if queries > 0 {
		rep.PrefixCacheHitRate = float64(hits) / float64(queries)
	}
	rep.KVTransfers, rep.KVTransferTime = len(fd.xfers), summarize(fd.xfers)
	return rep, nil
}

// vengine is one replica in a fleetDriver.
type vengine struct {
	eng      *engine
	index    int
	stepping bool
	stepEnd  time.Time
	load     int // requests sent here and not finished
}

// fleetDriver is SimulateFleet's discrete-event loop: the client of a
// vdriver (its requests, queue and report), many engines, and the events
// between them.
type fleetDriver struct {
	v                    *vdriver
	p                    Profile
	d                    derived
	bandwidth            float64
	all, prefill, decode []*vengine
	events               fleetEvents
	nextEvent            uint64
	xfers                []time.Duration
	reader               map[*seq]*vengine // a decode request's prefill replica, until its read starts
}

// fleetEvent is something that happens at a replica at a time: a request
// leaves a frontend for its engine, or a read ends.
type fleetEvent struct {
	at   time.Time
	seq  uint64 // FIFO among equal times
	to   *vengine
	s    *seq
	from *vengine // a read's prefill replica; nil for an arrival
	id   string   // the held request read
}

type fleetEvents []fleetEvent

func (h fleetEvents) Len() int { return len(h) }
func (h fleetEvents) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h fleetEvents) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *fleetEvents) Push(x any)   { *h = append(*h, x.(fleetEvent)) }
func (h *fleetEvents) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (fd *fleetDriver) push(ev fleetEvent) {
	fd.nextEvent++
	ev.seq = fd.nextEvent
	heap.Push(&fd.events, ev)
}

// least is the replica with the fewest outstanding requests (the lowest
// index among equals).
func least(es []*vengine) *vengine {
	best := es[0]
	for _, e := range es[1:] {
		if e.load < best.load {
			best = e
		}
	}
	return best
}

// sendTo routes s to e: it reaches e's engine after e's frontend.
func (fd *fleetDriver) sendTo(e *vengine, s *seq, now time.Time) {
	e.load++
	fd.push(fleetEvent{at: now.Add(fd.v.apiDelay(s.prompt)), to: e, s: s})
}

// finished is a request's sink on one replica: it tells the replica's
// load, then passes on.
type finished struct {
	e    *vengine
	next func(n int, reason finishReason, now time.Time)
}

func (f *finished) emit(n int, reason finishReason, now time.Time) {
	if reason != reasonNone {
		f.e.load--
	}
	f.next(n, reason, now)
}

func (fd *fleetDriver) dispatch(now time.Time) {
	v := fd.v
	for len(v.queue) > 0 && (v.w.MaxConcurrency <= 0 || v.inflight < v.w.MaxConcurrency) {
		r := v.queue[0]
		v.queue = v.queue[1:]
		r.sent = now
		v.inflight++
		v.peak = max(v.peak, v.inflight)
		fd.route(r, now)
	}
}

// route sends r to a colocated replica, or to a prefill replica first.
func (fd *fleetDriver) route(r *vreq, now time.Time) {
	if len(fd.prefill) == 0 {
		e := least(fd.decode)
		r.s.sink = &finished{e: e, next: r.emit}
		fd.sendTo(e, r.s, now)
		return
	}
	pe := least(fd.prefill)
	ps := &seq{id: r.s.id, prompt: r.s.prompt, target: 1, maxTokens: 1, salt: r.s.salt ^ 0x9f,
		kv: &seqKV{produce: true, reqID: fmt.Sprintf("r%d", r.s.id)}}
	ps.sink = &finished{e: pe, next: func(_ int, reason finishReason, now time.Time) {
		if reason != reasonNone {
			fd.toDecode(r, pe, ps, now)
		}
	}}
	fd.sendTo(pe, ps, now)
}

// toDecode sends r, prefilled on pe, to a decode replica with the
// prefill's kv_transfer_params.
func (fd *fleetDriver) toDecode(r *vreq, pe *vengine, ps *seq, now time.Time) {
	de := least(fd.decode)
	if out := ps.kv.out; out != nil {
		r.s.kv = &seqKV{load: &kvLoad{engineID: out.RemoteEngineID, requestID: out.RemoteRequestID, remote: out.RemoteBlockIDs}}
		fd.reader[r.s] = pe
	}
	r.s.sink = &finished{e: de, next: r.emit}
	fd.sendTo(de, r.s, now)
}

func (fd *fleetDriver) run() {
	v := fd.v
	fd.reader = map[*seq]*vengine{}
	v.now = time.Unix(0, 0)
	for v.done < len(v.reqs) {
		next := time.Time{}
		earliest := func(t time.Time) {
			if next.IsZero() || t.Before(next) {
				next = t
			}
		}
		for _, e := range fd.all {
			fd.startStep(e)
			if e.stepping {
				earliest(e.stepEnd)
			}
		}
		if v.next < len(v.reqs) {
			earliest(v.reqs[v.next].arrive)
		}
		if len(fd.events) > 0 {
			earliest(fd.events[0].at)
		}
		if next.IsZero() {
			return // nothing can happen: should not occur
		}
		v.now = next
		for v.next < len(v.reqs) && !v.reqs[v.next].arrive.After(v.now) {
			v.queue = append(v.queue, v.reqs[v.next])
			v.next++
		}
		fd.dispatch(v.now)
		for len(fd.events) > 0 && !fd.events[0].at.After(v.now) {
			ev := heap.Pop(&fd.events).(fleetEvent)
			if ev.from == nil {
				ev.s.arrival = ev.at
				ev.to.eng.add(ev.s, ev.at)
				continue
			}
			// A read ends: the prefill replica frees the blocks.
			ok := ev.from.eng.beginSend(ev.id, ev.from.eng.kvx.engineID, ev.s.kv.load.pull) == nil
			if ok {
				ev.from.eng.endSend(ev.id, true)
			}
			ev.to.eng.loadDone(ev.s, ok, ev.at)
		}
		for _, e := range fd.all {
			if e.stepping && !e.stepEnd.After(v.now) {
				e.eng.complete(e.stepEnd)
				e.stepping = false
			}
		}
		fd.dispatch(v.now)
	}
}

// startStep starts e's next step if it is idle and has work, and turns
// the reads its scheduler decided into events.
func (fd *fleetDriver) startStep(e *vengine) {
	if e.stepping {
		return
	}
	v := fd.v
	d := e.eng.schedule(v.now)
	for _, s := range e.eng.takePulls() {
		from := fd.reader[s]
		delete(fd.reader, s)
		bytes := float64(len(s.kv.load.pull)*fd.d.blockSize) * fd.d.kvBytesPerToken
		xfer := time.Duration(bytes / (fd.bandwidth * 1e9) * 1e9)
		fd.xfers = append(fd.xfers, xfer)
		fd.push(fleetEvent{at: v.now.Add(xfer), to: e, s: s, from: from, id: s.kv.load.requestID})
	}
	if d == 0 {
		return
	}
	e.stepping, e.stepEnd = true, v.now.Add(d)
	v.busy += d
	v.batchSum += float64(e.eng.load.seqs) * d.Seconds()
	kv := e.eng.kv.usage()
	v.kvSum += kv * d.Seconds()
	v.kvPeak = max(v.kvPeak, kv)
}

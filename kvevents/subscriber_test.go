package kvevents

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// recorder is a Sink that keeps what it is told.
type recorder struct {
	mu      sync.Mutex
	removed []uint64 // BlockRemoved hashes, in order
	resets  int
	changed chan struct{}
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 1)} }

func (r *recorder) Apply(e *Event) {
	r.mu.Lock()
	if e.Kind == KindBlockRemoved {
		r.removed = append(r.removed, e.BlockHashes...)
	}
	r.mu.Unlock()
	r.notify()
}

func (r *recorder) Reset() {
	r.mu.Lock()
	r.resets++
	r.removed = nil
	r.mu.Unlock()
	r.notify()
}

func (r *recorder) notify() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) snapshot() ([]uint64, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.removed...), r.resets
}

// waitFor waits until cond holds, woken by the sink's changes; it fails
// the test after 10 s.
func (r *recorder) waitFor(t *testing.T, what string, cond func(removed []uint64, resets int) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if cond(r.snapshot()) {
			return
		}
		select {
		case <-r.changed:
		case <-deadline:
			removed, resets := r.snapshot()
			t.Fatalf("timed out waiting for %s: removed %v, resets %d", what, removed, resets)
		}
	}
}

// marker is a batch carrying one BlockRemoved of hash h: the recorder
// lists the hashes in the order batches were applied.
func marker(h uint64) *Batch {
	return &Batch{TS: 1, Events: []Event{{Kind: KindBlockRemoved, BlockHashes: []uint64{h}, Medium: SomeString(MediumGPU)}}, DPRank: Some(0)}
}

type pair struct {
	pub   *Publisher
	sub   *Subscriber
	rec   *recorder
	reg   *prometheus.Registry
	fault atomic.Pointer[func(uint64) Fault]
	stop  func()
}

// startPair runs a Publisher and a Subscriber on loopback and waits until
// the subscription is live (a probe batch got through, hash 0).
func startPair(t *testing.T, replay bool, enc Encoding) *pair {
	t.Helper()
	p := &pair{rec: newRecorder(), reg: prometheus.NewRegistry()}
	pcfg := PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Encoding: enc, Topic: "kv@sim",
		Fault: func(seq uint64) Fault {
			if f := p.fault.Load(); f != nil {
				return (*f)(seq)
			}
			return FaultNone
		}}
	if replay {
		pcfg.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	pub, err := NewPublisher(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Listen(); err != nil {
		t.Fatal(err)
	}
	sub, err := NewSubscriber(SubscriberConfig{Pool: "m", Replica: "r0", Endpoint: pub.Addr(), ReplayEndpoint: pub.ReplayAddr(),
		Topic: "kv@", Sink: p.rec, Metrics: NewMetrics(p.reg), MinBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p.pub, p.sub = pub, sub
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = pub.Run(ctx) }()
	go func() { defer wg.Done(); _ = sub.Run(ctx) }()
	p.stop = func() { cancel(); wg.Wait() }
	t.Cleanup(p.stop)
	// Publish probes until one arrives by the PUB socket itself (not by a
	// replay): messages sent before the subscription reached the publisher
	// are dropped by PUB (ZMQ's slow joiner), and when nothing follows them
	// no gap shows until the next one.
	// Two in a row, so a probe that a replay in flight picked up can't pass.
	for i, live := 0, 0; live < 2; i++ {
		replays := p.counter("gpurouter_kv_event_replays_total")
		seen, _ := p.rec.snapshot()
		pub.Publish(marker(0))
		select {
		case <-p.rec.changed:
		case <-time.After(50 * time.Millisecond):
		}
		if now, _ := p.rec.snapshot(); len(now) > len(seen) && p.counter("gpurouter_kv_event_replays_total") == replays {
			live++
		} else {
			live = 0
		}
		if i == 200 {
			t.Fatal("no probe reached the subscriber")
		}
	}
	// The probes are done; the tests count from a clean slate.
	p.rec.mu.Lock()
	p.rec.removed = nil
	p.rec.mu.Unlock()
	return p
}

func (p *pair) setFault(f func(seq uint64) Fault) { p.fault.Store(&f) }

func (p *pair) counter(name string) float64 {
	return testutil.ToFloat64(counterOf(p.reg, name))
}

func counterOf(reg *prometheus.Registry, name string) prometheus.Collector {
	return collectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			var sum float64
			for _, m := range mf.Metric {
				sum += m.GetCounter().GetValue()
			}
			ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, "sum", nil, nil), prometheus.CounterValue, sum)
		}
	})
}

type collectorFunc func(chan<- prometheus.Metric)

func (f collectorFunc) Describe(chan<- *prometheus.Desc) {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) {
	f(ch)
}

func publishRange(p *Publisher, from, to uint64) {
	for h := from; h <= to; h++ {
		p.Publish(marker(h))
	}
}

func inOrder(from, to uint64) func([]uint64, int) bool {
	return func(removed []uint64, _ int) bool {
		if len(removed) < int(to-from+1) {
			return false
		}
		for i, h := range removed[len(removed)-int(to-from+1):] {
			if h != from+uint64(i) {
				return false
			}
		}
		return true
	}
}

func TestSubscriberFollowsBothEncodings(t *testing.T) {
	for _, enc := range []Encoding{EncodingArray, EncodingMap} {
		t.Run(enc.String(), func(t *testing.T) {
			p := startPair(t, true, enc)
			publishRange(p.pub, 1, 50)
			p.rec.waitFor(t, "50 batches in order", inOrder(1, 50))
			if _, resets := p.rec.snapshot(); resets != 0 {
				t.Fatalf("%d resets", resets)
			}
		})
	}
}

// TestGapTriggersReplay: a batch lost on the PUB socket (still in the
// replay buffer) is recovered in order, and the index is not dropped.
func TestGapTriggersReplay(t *testing.T) {
	p := startPair(t, true, EncodingMap)
	var dropped atomic.Bool
	p.setFault(func(uint64) Fault {
		if dropped.CompareAndSwap(false, true) {
			return FaultDrop
		}
		return FaultNone
	})
	publishRange(p.pub, 1, 20)
	p.rec.waitFor(t, "all 20 in order", inOrder(1, 20))
	if removed, resets := p.rec.snapshot(); resets != 0 || len(removed) != 20 {
		t.Fatalf("resets %d, applied %v", resets, removed)
	}
	if p.counter("gpurouter_kv_event_gaps_total") < 1 || p.counter("gpurouter_kv_event_resyncs_total") != 0 {
		t.Fatal("a gap should be counted, and no resync")
	}
}

// TestReorderedBatchesApplyInOrder: a batch sent after its successor is
// applied in sequence order, its late copy ignored.
func TestReorderedBatchesApplyInOrder(t *testing.T) {
	p := startPair(t, true, EncodingArray)
	var delayed atomic.Bool
	p.setFault(func(uint64) Fault {
		if delayed.CompareAndSwap(false, true) {
			return FaultDelay
		}
		return FaultNone
	})
	publishRange(p.pub, 1, 10)
	p.rec.waitFor(t, "all 10 in order", inOrder(1, 10))
	if removed, resets := p.rec.snapshot(); resets != 0 || len(removed) != 10 {
		t.Fatalf("resets %d, applied %v", resets, removed)
	}
}

// TestFailedReplayResyncs: a batch gone from the replay buffer too can't
// be recovered: the replica's entries are dropped (Reset) and rebuilt from
// the batches after it.
func TestFailedReplayResyncs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		replay bool
		fault  Fault
	}{
		{"lost from the replay buffer too", true, FaultLose},
		{"no replay socket", false, FaultDrop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startPair(t, tc.replay, EncodingMap)
			var hit atomic.Bool
			p.setFault(func(uint64) Fault {
				if hit.CompareAndSwap(false, true) {
					return tc.fault
				}
				return FaultNone
			})
			publishRange(p.pub, 1, 10) // batch 1 is lost
			p.rec.waitFor(t, "a reset, then 2…10", func(removed []uint64, resets int) bool {
				return resets == 1 && inOrder(2, 10)(removed, resets) && removed[0] == 2
			})
			if p.counter("gpurouter_kv_event_resyncs_total") != 1 {
				t.Fatal("resync not counted")
			}
		})
	}
}

// TestPublisherRestartResets: a new engine process starts its sequence
// numbers over: the old process's entries are dropped.
func TestPublisherRestartResets(t *testing.T) {
	p := startPair(t, true, EncodingArray)
	publishRange(p.pub, 1, 5)
	p.rec.waitFor(t, "1…5", inOrder(1, 5))
	addr, raddr := p.pub.Addr(), p.pub.ReplayAddr()
	// Stop only the publisher: a second one takes its ports.
	p2, err := NewPublisher(PublisherConfig{Endpoint: addr, ReplayEndpoint: raddr, Topic: "kv@sim"})
	if err != nil {
		t.Fatal(err)
	}
	stopOld := p.pub
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Closing the old publisher's sockets is what a dying process does.
	stopOld.mu.Lock()
	_ = stopOld.pub.Close()
	_ = stopOld.replay.Close()
	stopOld.mu.Unlock()
	var lerr error
	for range 100 {
		if lerr = p2.Listen(); lerr == nil {
			break
		}
		<-time.After(20 * time.Millisecond)
	}
	if lerr != nil {
		t.Fatal(lerr)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = p2.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// The new process publishes from sequence 0; the subscriber reconnects
	// (its backoff is 10 ms) and must drop what the old one held.
	for i := 0; ; i++ {
		p2.Publish(marker(100 + uint64(i)))
		select {
		case <-p.rec.changed:
		case <-time.After(50 * time.Millisecond):
		}
		if _, resets := p.rec.snapshot(); resets > 0 {
			break
		}
		if i == 200 {
			t.Fatal("restart never detected")
		}
	}
	removed, _ := p.rec.snapshot()
	for _, h := range removed {
		if h < 100 {
			t.Fatalf("the old process's batch %d survived the reset: %v", h, removed)
		}
	}
}
